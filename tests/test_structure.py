"""The layout holds: the card's scripts at the top, the shared code in the cram package below them, imports
in one direction with no circle; and a checkpoint written before the package
existed still resumes, fine-tunes and exports."""
import ast
import json
import os
import shutil

import torch

from conftest import ROOT, run_script
from model import saved_model_args

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


def test_the_style_check_reports_what_is_over_and_passes_what_is_within(tmp_path):
    """tools/style.py (CI runs it after the tests; a fork's tests never do): a figure per limit, a line per function
    over its length or parameter count, exit status 1; a tree within the limits passes. Comments, docstrings and blank
    lines are not counted."""
    (tmp_path / "cram").mkdir()
    (tmp_path / "train.py").write_text("def main():\n    return 1\n")
    (tmp_path / "cram" / "data.py").write_text("def small(a, b):\n    return a + b\n")
    assert "the house style holds" in run_script("tools/style.py", f"--root={tmp_path}").stdout
    prose = '    """A docstring\n    of two lines."""\n    # a comment, then a blank line\n\n'  # not code: free
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "model.py").write_text(f"def helper(a, b, c, d, e, f, g, h, k):\n{prose}{body}    return x0\n")
    proc = run_script("tools/style.py", f"--root={tmp_path}", check=False)
    assert proc.returncode == 1 and "the core: 66 lines of code (at most " in proc.stdout and " in 3 files" in proc.stdout
    assert "over: model.py:1 helper: 62 lines of code (at most 60)" in proc.stdout
    assert "over: model.py:1 helper: 9 parameters (at most 8)" in proc.stdout


def test_a_checkpoint_from_before_the_package_resumes_fine_tunes_and_exports(tmp_path):
    """The checkpoint and data in tests/fixtures/before_package (written by the layout before cram/) are plain
    dicts and files: a resume continues their run, fine-tuning scores it, the export writes it."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    data, ckpt = tmp_path / "old" / "data", tmp_path / "old" / "ckpt.pt"
    before = torch.load(ckpt, weights_only=True)
    run_script("train.py", f"--data_dir={data}", f"--out_dir={tmp_path / 'old'}", "--resume=True", "--max_steps=6",
               "--eval_sequences=16", "--device=cpu", "--compile=False", "--fill_in_examples=0")
    after = torch.load(ckpt, weights_only=True)
    assert (before["step"], after["step"]) == (4, 6)
    assert after["model_args"] == saved_model_args(before["model_args"])  # what it had, a newer field's default added
    assert after["config"]["lr"] == before["config"]["lr"] and after["config"]["batch_size"] == before["config"]["batch_size"]
    out = tmp_path / "glue.json"
    run_script("finetune_glue.py", f"--checkpoint={ckpt}", f"--glue_dir={os.path.join(ROOT, 'tests', 'fixtures', 'glue')}",
               "--tasks=rte", "--epochs=1", "--seeds=1", "--device=cpu", f"--out_json={out}")
    assert "rte" in json.loads(out.read_text())["scores"]
    run_script("tools/export.py", f"--checkpoint={ckpt}", f"--out_dir={tmp_path / 'hf'}")
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "hf"))


def test_a_checkpoint_of_learned_positions_from_before_the_position_scheme_resumes_and_exports(prepared, tmp_path):
    """Before position_scheme, model_args and config said learned_positions=True (the original BERT's positions):
    such a checkpoint resumes with its own positions, saves them under the new name, and exports."""
    from conftest import TINY_MODEL
    args = ["train.py", f"--data_dir={prepared}", f"--out_dir={tmp_path}", *TINY_MODEL, "--fill_in_examples=0"]
    run_script(*args, "--position_scheme=learned", "--max_steps=2")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    for fields in (ckpt["model_args"], ckpt["config"]):  # as the version before wrote them
        del fields["position_scheme"]
        fields["learned_positions"] = True
    torch.save(ckpt, tmp_path / "ckpt.pt")
    run_script(*args, "--resume=True", "--max_steps=4")
    after = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert after["step"] == 4 and after["model_args"]["position_scheme"] == "learned" and "pos_emb" in after["model"]
    assert after["model_args"] == saved_model_args(ckpt["model_args"])
    run_script("tools/export.py", f"--checkpoint={tmp_path / 'ckpt.pt'}", f"--out_dir={tmp_path / 'hf'}")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["position_scheme"] == "learned"
