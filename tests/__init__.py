"""The tests of taskhub: one package, imported as `tests.<module>` everywhere (pytest, plugins, subprocesses)."""
