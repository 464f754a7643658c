"""A run's files are its own, its saves fit the disk it checked, and it resumes only on the data it trained on
(issue 87, items 4, 5 and 7): each named case, and one of the same class that nobody named."""
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import TINY_MODEL, assert_one_line_error, run_script

BASE = [*TINY_MODEL, "--fill_in_examples=0", "--eval_sequences=32"]

# train.py on a disk with room for exactly what its disk check asks: the check's free space is read as what is left of
# it, and a checkpoint written past it fails as a full disk does (ENOSPC). Checkpoints and their temporaries fill it
# (a hard-linked file once); the logs' few kB do not.
SMALL_DISK = '''
import errno, os, runpy, shutil, sys
sys.path.insert(0, os.getcwd())
import torch
from cram import files
out_dir = os.path.abspath(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--out_dir=")))
disk = {}


def used():
    sizes = {}
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        if name.endswith((".pt", ".tmp")):
            stat = os.stat(os.path.join(out_dir, name))
            sizes[stat.st_ino] = stat.st_size
    return sum(sizes.values())


real_usage, real_claim, real_save = shutil.disk_usage, files.claim_folder, torch.save


def usage(path):
    real = real_usage(path)
    return real._replace(free=disk["capacity"] - used()) if "capacity" in disk else real


def claim(path, setting="--out_dir", need_bytes=0, files=()):
    if need_bytes:
        disk["capacity"] = used() + need_bytes
    return real_claim(path, setting, need_bytes, files)


def save(obj, f, *args, **kwargs):
    real_save(obj, f, *args, **kwargs)
    if "capacity" in disk and used() > disk["capacity"]:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


shutil.disk_usage, files.claim_folder, torch.save = usage, claim, save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def steps_saved(folder):
    return sorted(torch.load(os.path.join(folder, name), weights_only=True)["step"] for name in os.listdir(folder)
                  if name.startswith("ckpt"))


# ------------------------------------------------------------------ item 5: the disk check asks for the saves' peak
@pytest.mark.parametrize("keep", [3, 1])
def test_a_disk_with_the_room_the_check_asks_holds_every_save(prepared, tmp_path, keep):
    """keep_checkpoints 3 (the named case: it stopped at step 4, the disk full) and 1 (unnamed: ckpt.pt and the one
    being written): a run saving every step, then resumed with a smaller keep (held files it will prune count) and
    from another folder's checkpoint (nothing held), each on a disk with room for exactly what its check asked."""
    disk = tmp_path / "small_disk.py"
    disk.write_text(SMALL_DISK)
    out, run = tmp_path / "run", [disk, "train.py", f"--data_dir={prepared}", *BASE, "--ckpt_interval_minutes=0"]
    run_script(*run, f"--out_dir={out}", f"--keep_checkpoints={keep}", "--max_steps=6")
    assert steps_saved(out) == [4, 5, 6][-keep:]
    run_script(*run, f"--out_dir={out}", "--resume=True", "--keep_checkpoints=1", "--max_steps=8")
    assert steps_saved(out) == [8]
    run_script(*run, f"--out_dir={tmp_path / 'other'}", "--resume=True", f"--resume_from={out / 'ckpt.pt'}",
               f"--keep_checkpoints={keep}", "--max_steps=10")
    assert steps_saved(tmp_path / "other") == [9, 10][-keep:]


def test_the_disk_check_counts_the_checkpoints_held_and_the_one_being_written(tmp_path):
    """save_peak_bytes: keep + 1 checkpoints for a fresh run; a resume less those already there (ckpt.pt and its
    series), one at least (more held than kept: pruned after the write); a branch from an earlier step holds the series
    up to it (the rest is set aside, not freed)."""
    from cram.files import save_peak_bytes
    path = str(tmp_path / "ckpt.pt")
    assert [save_peak_bytes(path, keep, 10) for keep in (1, 3)] == [20, 40]
    for name in ("ckpt.pt", "ckpt_00000004.pt", "ckpt_00000005.pt"):
        (tmp_path / name).write_bytes(b"")
    assert [save_peak_bytes(path, keep, 10, resumed_step=6) for keep in (1, 3, 5)] == [10, 10, 30]
    assert save_peak_bytes(path, 3, 10, resumed_step=4, branched=True) == 30
    assert save_peak_bytes(str(tmp_path / "elsewhere" / "ckpt.pt"), 3, 10, resumed_step=6, branched=True) == 40


# ------------------------------------------------------------------ item 4: runs never touch each other's files
def contents(folder):
    return {name: (folder / name).read_bytes() for name in os.listdir(folder) if name != ".lock"}


@pytest.fixture(scope="module")
def two_runs(prepared, tmp_path_factory):
    """Run A at step 14 (its series 12 and 13), run B at step 12 (10 and 11), saving every step: two runs' folders."""
    root = tmp_path_factory.mktemp("two_runs")
    for name, steps, seed in (("a", 14, 0), ("b", 12, 1)):
        run_script("train.py", f"--data_dir={prepared}", f"--out_dir={root / name}", *BASE, f"--max_steps={steps}",
                   f"--seed={seed}", "--ckpt_interval_minutes=0")
    return root


def test_a_resume_into_another_runs_folder_is_refused(prepared, two_runs, tmp_path):
    """The named case: A's ckpt.pt resumed in B's folder would prune B's series and append to its metrics.jsonl; an
    earlier checkpoint of A there (unnamed) would set B's ckpt.pt aside; a folder with B's metrics.jsonl alone (a run
    stopped before its first save, unnamed) would be appended to: each is one line, B's files untouched. A fresh
    --out_dir (the advice), or a copy of A's own folder, resumes."""
    a, b = two_runs / "a", two_runs / "b"
    only_log = tmp_path / "only_log"
    only_log.mkdir()
    shutil.copy(b / "metrics.jsonl", only_log)
    base = ["train.py", f"--data_dir={prepared}", *BASE, "--resume=True", "--max_steps=16", "--ckpt_interval_minutes=0"]
    for folder, source, named in ((b, a / "ckpt.pt", "ckpt_00000010.pt, ckpt_00000011.pt, metrics.jsonl"),
                                  (b, a / "ckpt_00000012.pt", "ckpt.pt"), (only_log, a / "ckpt.pt", "metrics.jsonl")):
        before = contents(folder)
        proc = run_script(*base, f"--out_dir={folder}", f"--resume_from={source}", check=False)
        assert_one_line_error(proc, f"{folder} holds another run's files", named, "a fresh --out_dir", f"its own, {a}")
        assert contents(folder) == before, source
    fresh = tmp_path / "fresh"
    run_script(*base, f"--out_dir={fresh}", f"--resume_from={a / 'ckpt.pt'}")
    assert steps_saved(fresh) == [15, 16]
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    run_script(*base, f"--out_dir={copy}", f"--resume_from={a / 'ckpt_00000013.pt'}")  # the same run: its own files
    assert steps_saved(copy) == [14, 15, 16] and (copy / "abandoned_ckpt.pt").exists()  # 14 of the copy set aside


def test_a_checkpoint_without_a_run_id_resumes_only_in_its_own_folder(prepared, two_runs, tmp_path):
    """An older cram's checkpoint names no run: in its own folder it resumes as before; from elsewhere into a folder
    of run files nobody can tell are its own, it is refused; into a fresh folder it resumes."""
    old = tmp_path / "old"
    shutil.copytree(two_runs / "a", old)
    for path in [old / "ckpt.pt"] + sorted(old.glob("ckpt_*.pt")):
        state = torch.load(path, weights_only=True)
        del state["run"]
        torch.save(state, path)
    base = ["train.py", f"--data_dir={prepared}", *BASE, "--resume=True", "--max_steps=15"]
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(old, elsewhere)
    proc = run_script(*base, f"--out_dir={elsewhere}", f"--resume_from={old / 'ckpt.pt'}", check=False)
    assert_one_line_error(proc, "holds another run's files")
    run_script(*base, f"--out_dir={tmp_path / 'fresh'}", f"--resume_from={old / 'ckpt.pt'}")
    run_script(*base, f"--out_dir={old}")
    assert torch.load(old / "ckpt.pt")["step"] == 15


# ------------------------------------------------------------------ item 7: a data folder is known whole
def test_a_resume_on_data_with_other_splits_or_rows_is_refused(prepared, corpus_file, tmp_path):
    """The named case: the corpus prepared again with --val_fraction=0.3 (the same tokenizer), in another folder as
    prepare.py advises (its own refuses other settings), where validation would hold trained text; unnamed: the same
    sizes with two training rows swapped (another order), and one validation row changed (only validation new). Each
    is one line naming the split and the data to resume with; the checkpoint is untouched. The same files in a copy,
    and an older checkpoint without the digests on its own data, resume."""
    data, out = tmp_path / "data", tmp_path / "run"
    shutil.copytree(prepared, data)
    run = ["train.py", f"--out_dir={out}", *BASE]
    run_script(*run, f"--data_dir={data}", "--max_steps=3")
    before = (out / "ckpt.pt").read_bytes()
    resplit = tmp_path / "resplit"
    run_script("prepare.py", f"--dataset={corpus_file}", f"--out_dir={resplit}", "--vocab_size=384", "--seq_len=32",
               "--val_fraction=0.3")
    swapped, changed = tmp_path / "swapped", tmp_path / "changed"
    for folder, split, rows in ((swapped, "train", [[400, 401], [401, 400]]), (changed, "val", [[7], [8]])):
        shutil.copytree(data, folder)
        tokens = np.memmap(folder / f"{split}.bin", dtype=np.uint16, mode="r+").reshape(-1, 32)
        tokens[rows[0]] = tokens[rows[1]]
        tokens.flush()
    for folder, fragments in ((resplit, ["training rows: 1,023 sequences, now", "validation rows: 60 sequences, now"]),
                              (swapped, ["training rows: other ones or in another order, 1,023 as before"]),
                              (changed, ["validation rows: other ones", "only validation is new"])):
        proc = run_script(*run, f"--data_dir={folder}", "--resume=True", "--max_steps=4", check=False)
        assert_one_line_error(proc, f"{folder} is not the data", *fragments, f"--data_dir={data}")
        assert (out / "ckpt.pt").read_bytes() == before, folder
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    run_script(*run, f"--data_dir={copy}", "--resume=True", "--max_steps=4")
    state = torch.load(out / "ckpt.pt", weights_only=True)
    del state["meta"]["digests"]  # as an older cram wrote it
    torch.save(state, out / "ckpt.pt")
    run_script(*run, f"--data_dir={data}", "--resume=True", "--max_steps=5")
    assert torch.load(out / "ckpt.pt")["step"] == 5
