"""Forms that leave no reference cycle behind them.

Django's form keeps the bound fields it made (`_bound_fields_cache`) and each bound field holds its form: a cycle, so
a form a page rendered, with its deep-copied fields, widgets and choices (about 200 objects for the task list's
filter bar), is freed only by the cyclic garbage collector, never when the request drops it. Those objects made
every few hundred pages pay a young collection of 20-40 ms in whichever request crossed the threshold (bench/pages.py:
the GC column; GC_YOUNG_THRESHOLD in taskhub/runtime.py). Here a bound field refers to its form weakly, and a
model choice field's choices to their field: the form and all it holds go with the page's last reference to it.
"""

import weakref

from django import forms


class AcyclicForm(forms.Form):
    def __getitem__(self, name: str) -> forms.BoundField:
        bound = self._bound_fields_cache.get(name)
        if bound is None:
            if name not in self.fields:
                return super().__getitem__(name)  # Django's KeyError, which names the fields there are
            bound = self.fields[name].get_bound_field(weakref.proxy(self), name)
            self._bound_fields_cache[name] = bound
        return bound


class AcyclicModelChoiceField(forms.ModelChoiceField):
    """Django's field makes its widget's choices an iterator that holds the field (a cycle through the widget)."""

    def _get_choices(self):
        if hasattr(self, "_choices"):
            return self._choices
        return self.iterator(weakref.proxy(self))

    choices = property(_get_choices, forms.ChoiceField.choices.fset)
