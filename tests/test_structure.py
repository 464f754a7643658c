"""The layout holds: the card's scripts at the top, the shared code in the cram package below them, imports
in one direction with no circle, the core's size limits; and a checkpoint written before the package
existed still resumes, fine-tunes and exports."""
import ast
import json
import os
import shutil

import torch

from conftest import ROOT, run_script

SCRIPTS = ("train.py", "prepare.py", "finetune_glue.py", "bench.py")  # what a user runs; none imports another
TOP_MODULES = ("model.py", "configurator.py")  # the top level's two modules, which import nothing of cram's
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "before_package")


def package_files():
    return sorted(f"cram/{name}" for name in os.listdir(os.path.join(ROOT, "cram")) if name.endswith(".py"))


def ours(path):
    """The modules of cram's own that `path` (relative to the root) imports anywhere in it: 'train',
    'model', 'cram.data', ... (a package module's relative imports resolved)."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = ("cram" + (f".{node.module}" if node.module else "")) if node.level else node.module
            names |= {f"cram.{a.name}" for a in node.names} if module == "cram" else {module}
    top = {name[:-3] for name in (*SCRIPTS, *TOP_MODULES)}
    return {n for n in names if n in top or n.startswith("cram")} - {"cram"}


def test_the_top_level_is_the_card_s():
    top = sorted(name for name in os.listdir(ROOT) if name.endswith(".py"))
    assert top == sorted((*SCRIPTS, *TOP_MODULES))


def test_imports_go_one_way_with_no_circle():
    graph = {path[:-3].replace("/", "."): ours(path) for path in (*SCRIPTS, *TOP_MODULES, *package_files())}
    scripts = {name[:-3] for name in SCRIPTS}
    for module, imported in graph.items():
        if module.startswith("cram."):
            assert not imported & scripts, f"{module} imports a script: {imported & scripts}"
        if module in scripts:
            assert not imported & scripts, f"{module} imports another script: {imported & scripts}"
        if module in ("model", "configurator"):
            assert not {n for n in imported if n.startswith("cram")}, f"{module} imports cram: {imported}"
    timed = {"tools/bench_prepare.py": {"prepare"}}  # times prepare.py's own encoding pass, as the tests import scripts
    for tool in (f"tools/{n}" for n in os.listdir(os.path.join(ROOT, "tools")) if n.endswith(".py")):
        assert ours(tool) & scripts <= timed.get(tool, set()), f"{tool} imports a script"
    state = {}  # a depth-first search for a circle: 1 on the current path, 2 done

    def visit(module, path):
        assert state.get(module) != 1, f"an import circle: {' -> '.join(path + [module])}"
        if state.get(module) == 2 or module not in graph:
            return
        state[module] = 1
        for other in sorted(graph[module]):
            visit(other, path + [module])
        state[module] = 2

    for module in graph:
        visit(module, [])


def test_the_core_stays_small():
    """The six top-level files and the package: at most 5,100 lines (issue 78's 4,900, and issue 77's fine-tuning
    protocols and test-set predictions), train.py at most 400; each main() at most 90
    lines, every other function at most 60 and 8 parameters (self and cls not counted)."""
    core = (*SCRIPTS, *TOP_MODULES, *package_files())
    lines = {path: open(os.path.join(ROOT, path), encoding="utf-8").read() for path in core}
    assert sum(len(text.splitlines()) for text in lines.values()) <= 5100
    assert len(lines["train.py"].splitlines()) <= 400
    for path, text in lines.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")]
                params += [a.arg for a in (args.vararg, args.kwarg) if a]
                assert node.end_lineno - node.lineno + 1 <= (90 if node.name == "main" else 60), (path, node.name)
                assert len(params) <= 8, (path, node.name, params)


def test_a_checkpoint_from_before_the_package_resumes_fine_tunes_and_exports(tmp_path):
    """The checkpoint and data in tests/fixtures/before_package (written by the layout before cram/) are plain
    dicts and files: a resume continues their run, fine-tuning scores it, the export writes it."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    data, ckpt = tmp_path / "old" / "data", tmp_path / "old" / "ckpt.pt"
    before = torch.load(ckpt, weights_only=True)
    run_script("train.py", f"--data_dir={data}", f"--out_dir={tmp_path / 'old'}", "--resume=True", "--max_steps=6",
               "--eval_sequences=16", "--device=cpu", "--compile=False", "--fill_in_examples=0")
    after = torch.load(ckpt, weights_only=True)
    assert (before["step"], after["step"]) == (4, 6) and after["model_args"] == before["model_args"]
    assert after["config"]["lr"] == before["config"]["lr"] and after["config"]["batch_size"] == before["config"]["batch_size"]
    out = tmp_path / "glue.json"
    run_script("finetune_glue.py", f"--checkpoint={ckpt}", f"--glue_dir={os.path.join(ROOT, 'tests', 'fixtures', 'glue')}",
               "--tasks=rte", "--epochs=1", "--seeds=1", "--device=cpu", f"--out_json={out}")
    assert "rte" in json.loads(out.read_text())["scores"]
    run_script("tools/export.py", f"--checkpoint={ckpt}", f"--out_dir={tmp_path / 'hf'}")
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "hf"))
