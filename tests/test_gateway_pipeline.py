"""The gateway has one handler pipeline (radixgate/gateway/pipeline.py): each API's package converts
only its own wire format, and none of them strings the shared steps together itself."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_PACKAGES = ("anthropic", "openai", "vllm")
PIPELINE_STEPS = {"render_request", "engine_request", "compile_constraint",
                  "render_continuation_request"}


def api_modules() -> list[Path]:
    return sorted(p for name in API_PACKAGES for p in (ROOT / "radixgate" / "gateway" / name).rglob("*.py"))


def pipeline_steps_used(path: Path) -> set[str]:
    """The pipeline steps a module imports, names or calls (as a name or an attribute)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return used & PIPELINE_STEPS


def test_there_are_api_modules_to_check():
    names = {p.relative_to(ROOT / "radixgate" / "gateway").as_posix() for p in api_modules()}
    assert {"anthropic/messages.py", "openai/chat.py", "openai/completions.py",
            "openai/responses/api.py", "vllm/utility.py"} <= names


def test_no_api_module_runs_a_pipeline_step_itself():
    found = {p.relative_to(ROOT).as_posix(): sorted(pipeline_steps_used(p))
             for p in api_modules()}
    assert {path: steps for path, steps in found.items() if steps} == {}


def test_the_check_sees_a_step_however_it_is_reached(tmp_path):
    module = tmp_path / "handler.py"
    module.write_text("from radixgate.gateway import service\n"
                      "async def h(s):\n    return await service.engine_request(s)\n")
    assert pipeline_steps_used(module) == {"engine_request"}
    module.write_text("from radixgate.gateway.constraints import compile_constraint as c\n")
    assert pipeline_steps_used(module) == {"compile_constraint"}
