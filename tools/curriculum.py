"""The reference's curriculum on prepared data: train.bin's blocks sorted by sentence ends, most first.

    python tools/curriculum.py --data_dir=data/books --block=65536
    python train.py --data_dir=data/books --data_order=file    # the first epoch in train.bin's order

Sorting the whole file would need it in memory, so each block of `block` train sequences is sorted
on its own, by its count of sentence-ending tokens (ids whose bytes end with . ! or ?, maybe followed
by closing quotes or brackets), most first, ties in corpus order (a stable sort), one block in
memory at a time. meta.json gains curriculum_block, curriculum_blocks and sentence_end_token_ids;
the rest of the folder is left as it was.

A kill at any point loses nothing, because train.bin is never written in place: the sorted blocks
go to a copy beside it (train.bin.curriculum-<block>.tmp), each synced before the next, and a rerun
continues the copy (its length is its progress record; the last whole block is redone, in case a
power cut left it unsynced). Once the copy is whole, meta.json records the pass, then the copy is
renamed over train.bin (atomic); a kill between the two is finished by the next run, which finds
the record and the copy. Simpler than journaling blocks overwritten in place: no block is ever half
written, so there is nothing to repair and no state but the copy, at the price of room on disk for
a second train.bin until the rename.
"""
import glob
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import configure  # noqa: E402  (the core sits one folder up)
from cram.data import load_tokenizer, load_tokens  # noqa: E402
from cram.files import cannot_write, load_meta, write_json  # noqa: E402
from cram.process import guarded, progress  # noqa: E402

# -----------------------------------------------------------------------------
data_dir = "data/pydocs"  # a folder prepare.py wrote
block = 65536           # >= 1: train sequences sorted together: bounds the memory (16-32 MB), keeps the curriculum mild
# -----------------------------------------------------------------------------

# a token ends a sentence when its bytes end with . ! or ?, then maybe closing quotes or brackets (ASCII or UTF-8 ’ ”)
SENTENCE_END = re.compile(rb"[.!?](?:[\"')\]]|\xe2\x80[\x99\x9d])*$")


def sentence_end_ids(enc):
    """A lookup table over the vocabulary: True for the tokens that end a sentence (never a special token)."""
    ends = np.zeros(enc.n_vocab, dtype=bool)
    special = {enc.encode_single_token(name) for name in enc.special_tokens_set}  # their ids, not their names
    for token in range(enc.n_vocab):
        ends[token] = token not in special and bool(SENTENCE_END.search(enc.decode_single_token_bytes(token)))
    return ends


def sort_block(rows, ends):
    """rows sorted by their count of sentence-ending tokens, most first; ties keep their order."""
    return rows[np.argsort(-ends[rows].sum(axis=1), kind="stable")]


def copy_path(folder, block_size):
    return os.path.join(folder, f"train.bin.curriculum-{block_size}.tmp")


def remove_other_copies(folder, keep):
    """The copies of interrupted passes with another block size: abandoned, as large as train.bin."""
    for path in glob.glob(os.path.join(glob.escape(folder), "train.bin.curriculum-*.tmp")):
        if path != keep:
            os.remove(path)


def write_sorted_copy(tokens, ends, path, block_size):
    """Write the blocks of tokens (sequences x seq_len), each sorted, to path, continuing the copy an
    interrupted run left there; each block is synced before the next. Returns the number of blocks."""
    block_bytes = block_size * tokens.shape[1] * tokens.dtype.itemsize
    n_blocks = -(-len(tokens) // block_size)
    whole = os.path.getsize(path) // block_bytes if os.path.exists(path) else 0
    start = max(0, whole - 1)  # the last whole block is redone: a power cut may have left it unsynced
    if start:
        print(f"continuing the sorted copy at block {start + 1:,} of {n_blocks:,} (an interrupted pass left it)")
    try:  # a failed write (a full disk) is one line naming the copy, which the rerun continues
        with open(path, "ab") as f:
            f.truncate(start * block_bytes)  # and whatever came after it: a block cut short by the kill
            bar = progress(total=n_blocks, desc="curriculum", unit=" blocks", initial=start)
            for i in range(start, n_blocks):
                f.write(sort_block(np.asarray(tokens[i * block_size:(i + 1) * block_size]), ends).tobytes())
                f.flush()
                os.fsync(f.fileno())
                bar.update()
            bar.close()
    except OSError as e:
        raise cannot_write(path, e)
    return n_blocks


def finish_earlier_pass(folder, meta):
    """The block size of a pass meta.json records (prepare.py's old pass kept it in its settings),
    or None; a copy left by a kill between the record and the rename is renamed into place."""
    if "curriculum_blocks" not in meta:
        return None
    done = meta.get("curriculum_block", meta["settings"].get("curriculum_block"))
    if os.path.exists(copy_path(folder, done)):
        os.replace(copy_path(folder, done), os.path.join(folder, "train.bin"))
    return done


def main():
    meta = load_meta(data_dir)
    done = finish_earlier_pass(data_dir, meta)
    if done is not None and done != block:
        raise SystemExit(f"error: {data_dir} is already sorted in blocks of {done}; prepare it again to sort "
                         f"it in blocks of {block}")
    if done is not None:
        print(f"{data_dir} is already sorted in blocks of {block}")
        return
    tokens = load_tokens(data_dir, "train", meta)
    ends = sentence_end_ids(load_tokenizer(data_dir, meta))
    copy = copy_path(data_dir, block)
    remove_other_copies(data_dir, copy)
    n_blocks = write_sorted_copy(tokens, ends, copy, block)
    meta.update(curriculum_block=block, curriculum_blocks=n_blocks, sentence_end_token_ids=int(ends.sum()))
    write_json(os.path.join(data_dir, "meta.json"), meta)
    os.replace(copy, os.path.join(data_dir, "train.bin"))
    print(f"sorted {data_dir}/train.bin: {n_blocks:,} blocks of up to {block:,} sequences, most sentence ends "
          f"first ({int(ends.sum())} of {len(ends)} token ids end a sentence); train with --data_order=file")


if __name__ == "__main__":
    configure(globals(), sys.argv[1:])
    guarded(main, f"{data_dir} is as it was (train.bin is replaced only once its sorted copy is whole); run the "
            f"same command again")
