"""``import effectgate`` imports no framework; a missing extra names the pip command."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "agents", "openai", "llama_index",
              "llama_index_instrumentation", "workflows", "mcp", "pydantic_ai", "dbos",
              "temporalio", "google", "crewai", "agent_framework")


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_import_effectgate_imports_no_framework() -> None:
    done = python(f"""
        import json, sys
        import effectgate, effectgate.integrations, effectgate.testing
        import effectgate.integrations.durable
        roots = {{name.split(".")[0] for name in sys.modules}}
        print(json.dumps(sorted(roots & set({list(FRAMEWORKS)!r}))))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_langchain_integration_does_not_import_langchain_agents_until_the_middleware() -> None:
    pytest.importorskip("langchain.agents")
    done = python("""
        import sys
        import effectgate.integrations.langchain as lc
        before = "langchain.agents" in sys.modules
        lc.EffectGateMiddleware
        print(before, "langchain.agents" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("langchain", "langchain_core", "langchain"),
    ("openai_agents", "agents", "openai-agents"),
    ("llama_index", "llama_index", "llama-index"),
    ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("durable.dbos", "dbos", "dbos"),
    ("durable.temporal", "temporalio", "temporal"),
    ("google_adk", "google.adk", "google-adk"),
    ("crewai", "crewai", "crewai"),
    ("agent_framework", "agent_framework", "agent-framework"),
])
def test_a_missing_extra_raises_import_error_naming_the_pip_command(
        module: str, blocked: str, extra: str) -> None:
    done = python(f"""
        import sys
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name == {blocked!r} or name.startswith({blocked!r} + "."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None
        sys.meta_path.insert(0, Blocker())
        try:
            import effectgate.integrations.{module}
        except ImportError as err:
            print(err)
        else:
            print("imported")
    """)
    assert done.returncode == 0, done.stderr
    assert f'pip install ".[{extra}]" in the effectgate clone' in done.stdout


WINGS = ("effectgate.cli", "effectgate.bench", "effectgate.verify", "effectgate.demo",
         "effectgate.console", "effectgate.viz", "effectgate.integrations.")


def test_the_kernel_imports_no_wing_and_no_integration() -> None:
    """Every kernel module, imported on its own, pulls in no tooling wing (cli, bench,
    verify, demo, console, viz), no integration and no framework."""
    done = python(f"""
        import json, pkgutil, sys, importlib
        import effectgate, effectgate.store
        kernel = [m.name for m in pkgutil.iter_modules(effectgate.__path__, "effectgate.")
                  if not (m.name + ".").startswith({WINGS!r})
                  and m.name != "effectgate.integrations"]
        kernel += [m.name for m in pkgutil.iter_modules(effectgate.store.__path__,
                                                        "effectgate.store.")]
        for name in kernel:
            importlib.import_module(name)
        loaded = sorted(n for n in sys.modules if n.startswith({WINGS!r})
                        or n.split(".")[0] in {list(FRAMEWORKS)!r})
        print(json.dumps([kernel, loaded]))
    """)
    assert done.returncode == 0, done.stderr
    kernel, loaded = json.loads(done.stdout)
    assert {"effectgate.decide", "effectgate.gate", "effectgate.flow", "effectgate.store",
            "effectgate.store.statements"} <= set(kernel)
    assert loaded == [], loaded


def test_import_effectgate_is_light() -> None:
    """``import effectgate`` does not load SQL dialects it does not use, pydantic's policy
    machinery, the vendor SDKs or asyncio (50-90 ms here, for a program with no async tool)
    before a gate is made (start-up; see the performance issue)."""
    done = python("""
        import json, sys
        import effectgate
        print(json.dumps(sorted(n for n in sys.modules if n.startswith(
            ("httpx", "requests", "sqlalchemy", "pydantic", "importlib.metadata",
             "opentelemetry", "asyncio")))))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


_WORKER = """
import json, sys, effectgate as eg
gate = eg.Gate(sys.argv[1], namespace="w", policy=False)
@gate.effect("w:{n}", effect_type="t.start")
def work(n: int) -> int:
    return n
assert work(1) == 1
LATER = ("effectgate.stored", "effectgate.sagas", "urllib.parse")
begun = [m for m in LATER if m in sys.modules]
gate.get("w:1")
print(json.dumps([begun, [m for m in LATER if m in sys.modules]]))
"""


def test_a_workers_first_begin_leaves_the_stored_records_and_sagas_for_later(
        tmp_path: Path) -> None:
    """A worker's way to its first begin on an existing store does not define the stored
    records (frozen dataclasses: a few ms each of every start), the sagas or urllib.parse
    (with ipaddress); its first ``get`` loads the records (the control: the check sees them)."""
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    run = [sys.executable, "-c", _WORKER, url]
    subprocess.run(run, check=True, capture_output=True, timeout=120)  # creates the store
    begun, after_get = json.loads(subprocess.run(run, check=True, capture_output=True,
                                                 text=True, timeout=120).stdout)
    assert begun == [], begun
    assert after_get == ["effectgate.stored"], after_get
