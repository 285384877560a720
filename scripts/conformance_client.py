"""The MCP conformance suite's client under test: `python -m taskhub.mcp`, driven per scenario.

The suite (`conformance client --command "PYTHON scripts/conformance_client.py"`) starts a scenario server and runs
this with the server's URL as the last argument, the scenario's name in MCP_CONFORMANCE_SCENARIO and its context
(the tool calls to make, when it has any) in MCP_CONFORMANCE_CONTEXT. Every call goes through the real command line
(`python -m taskhub.mcp call --url URL TOOL --args JSON`), one process per call, as a person would run it.

- http-custom-headers: makes the context's tool calls; the server checks their `Mcp-Param-*` headers.
- http-invalid-tool-headers: lists the tools and calls each one, with placeholder values for required
  arguments; the command line must call the valid tool and refuse the others (exit 4) before sending anything.
- initialize, tools_call, elicitation-sep1034-client-defaults, sse-retry (the 2025-11-25 revision): lists the tools
  and calls each one with placeholder arguments, accepting every question the server asks in the middle of a call
  (`--answer '*={"action":"accept"}'`: the command line fills in the form's defaults, SEP-1034).

- auth/* (`scripts/conformance.sh auth`, spec 2026-07-28): calls the scenario server's tool authorizing by OAuth, the
  context mapped to the command line's OAuth flags (`oauth_flags`): client credentials (a secret, or a private key for
  a JWT assertion) for auth/client-credentials-*, else the authorization code grant completed without a person
  (`--oauth-unattended`, the suite's authorization server approving by itself) as a client with the suite's Client ID
  Metadata Document URL, or pre-registered (`client_id`, `client_secret`, `issuer`) where the context gives one.
  auth/basic-cimd is authorized as a person would (`--oauth`: the loopback redirect, a urllib "browser").
  Secrets reach the command line in files, never as arguments.

Exit status: 0 when every call ended as the command line's exit-status table allows for it (0, or 4 for a
refused tool), 1 otherwise, 2 for an unknown scenario.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CLI = [sys.executable, "-m", "taskhub.mcp"]
PLACEHOLDERS = {"string": "conformance", "integer": 1, "boolean": True, "number": 1}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    process = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    lines = [f"$ python -m taskhub.mcp {' '.join(args)}", f"-> exit {process.returncode}"]
    lines += [stream.rstrip() for stream in (process.stdout, process.stderr) if stream.strip()]
    print("\n".join(lines), flush=True)
    return process


def call(url: str, tool: str, arguments: dict[str, Any], *options: str) -> int:
    return run_cli("call", "--url", url, tool, "--args", json.dumps(arguments), "--timeout", "30", *options).returncode


def placeholder_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    schema = tool.get("inputSchema") if isinstance(tool.get("inputSchema"), dict) else {}
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    arguments = {}
    for name in schema.get("required") or []:
        spec = properties.get(name) if isinstance(properties.get(name), dict) else {}
        kind = spec.get("type")
        arguments[name] = PLACEHOLDERS.get(kind, "conformance") if isinstance(kind, str) else "conformance"
    return arguments


def custom_headers(url: str, context: dict[str, Any]) -> int:
    statuses = [call(url, item["name"], item.get("arguments") or {}) for item in context.get("toolCalls") or []]
    return 0 if statuses and all(status == 0 for status in statuses) else 1


def invalid_tool_headers(url: str, context: dict[str, Any]) -> int:
    listing = run_cli("discover", "--url", url, "--json")
    if listing.returncode != 0:
        return 1
    tools = json.loads(listing.stdout.splitlines()[-1])["tools"]
    # One process per call, a few at a time: most of each is Python starting up.
    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = list(pool.map(lambda tool: call(url, tool["name"], placeholder_arguments(tool)), tools))
    return 0 if statuses and all(status in (0, 4) for status in statuses) else 1


def every_tool_accepting(url: str, context: dict[str, Any]) -> int:
    listing = run_cli("discover", "--url", url, "--json")
    if listing.returncode != 0:
        return 1
    tools = json.loads(listing.stdout.splitlines()[-1])["tools"]
    accept = ("--answer", '*={"action": "accept"}')
    statuses = [call(url, tool["name"], placeholder_arguments(tool), *accept) for tool in tools]
    return 0 if all(status == 0 for status in statuses) else 1


# The Client ID Metadata Document URL the suite's authorization servers expect (auth/basic-cimd).
CONFORMANCE_CIMD_URL = "https://conformance-test.local/client-metadata.json"


def oauth_flags(scenario: str, context: dict[str, Any], folder: str) -> list[str]:
    """The command line's OAuth flags for an auth/ scenario's context: secrets and keys go into files (never on a
    command line), tokens into a token file the scenario's commands share."""

    def secret_file(name: str, text: str) -> str:
        path = os.path.join(folder, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as file:
            file.write(text)
        return path

    flags = ["--token-file", os.path.join(folder, "tokens.json")]
    if scenario.startswith("auth/client-credentials-"):
        flags += ["--client-credentials", "--client-id", context["client_id"]]
        if context.get("private_key_pem"):
            flags += ["--private-key-file", secret_file("key.pem", context["private_key_pem"])]
            if context.get("signing_algorithm"):
                flags += ["--jwt-algorithm", context["signing_algorithm"]]
        else:
            flags += ["--client-secret-file", secret_file("secret", context["client_secret"])]
        return flags
    flags += ["--oauth-unattended", "--client-metadata-url", CONFORMANCE_CIMD_URL]
    if context.get("client_id"):
        flags += ["--client-id", context["client_id"]]
        if context.get("client_secret"):
            flags += ["--client-secret-file", secret_file("secret", context["client_secret"])]
        if context.get("issuer"):
            flags += ["--issuer", context["issuer"]]
    return flags


# The one tool every auth/ scenario's server serves.
AUTH_SCENARIO_TOOL = "test-tool"


# This scenario's authorization is done as a person would (--oauth, the loopback redirect): see as_a_person.
PERSON_SCENARIO = "auth/basic-cimd"


def as_a_person(arguments: list[str]) -> int:
    """`python -m taskhub.mcp ... --oauth`: the command prints the URL to open and waits; a browser (here urllib: the
    suite's authorization server approves at once, no page to click through) opens it and follows its redirect to the
    command's loopback listener."""
    print(f"$ python -m taskhub.mcp {' '.join(arguments)}  (a person opens the URL)", flush=True)
    process = subprocess.Popen([*CLI, *arguments], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    assert process.stderr is not None
    for line in process.stderr:
        said.append(line)
        if line.startswith("  http"):
            try:
                browser_follows(line.strip())
            except OSError as error:
                said.append(f"(the browser: {error})\n")
    out, _ = process.communicate(timeout=60)
    print(f"-> exit {process.returncode}", "".join(said).rstrip(), out.rstrip(), sep="\n", flush=True)
    return process.returncode


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def browser_follows(authorization_url: str) -> None:
    try:
        urllib.request.build_opener(_NoRedirects).open(authorization_url, timeout=10)
        raise OSError("the authorization server did not redirect")
    except urllib.error.HTTPError as answer:
        location = answer.headers.get("Location")
    if not location:
        raise OSError("the authorization server's redirect has no Location")
    with urllib.request.urlopen(location, timeout=10):
        pass


def authorized_call(url: str, context: dict[str, Any]) -> int:
    """auth/*: calls the scenario server's tool (`call` discovers and lists the tools first), authorizing when the
    server demands it as the context's flags say (where a person would approve, the scenario's authorization server
    approves by itself: --oauth-unattended). One process per scenario: most of it is Python starting up."""
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    with tempfile.TemporaryDirectory(prefix="taskhub-conformance-") as folder:
        flags = oauth_flags(scenario, context, folder)
        if scenario == PERSON_SCENARIO:
            flags = ["--oauth" if flag == "--oauth-unattended" else flag for flag in flags]
            status = as_a_person(["call", "--url", url, AUTH_SCENARIO_TOOL, "--timeout", "30", *flags])
        else:
            status = call(url, AUTH_SCENARIO_TOOL, {}, *flags)
    return 0 if status == 0 else 1


SCENARIOS = {
    "http-custom-headers": custom_headers,
    "http-invalid-tool-headers": invalid_tool_headers,
    "initialize": every_tool_accepting,
    "tools_call": every_tool_accepting,
    "elicitation-sep1034-client-defaults": every_tool_accepting,
    "sse-retry": every_tool_accepting,
}


def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if scenario.startswith("auth/"):
        return authorized_call(url, context)
    if scenario not in SCENARIOS:
        print(f"conformance_client: no driver for scenario {scenario!r}", file=sys.stderr)
        return 2
    return SCENARIOS[scenario](url, context)


if __name__ == "__main__":
    sys.exit(main())
