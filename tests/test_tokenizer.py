import prepare
from conftest import synthetic_corpus
from cram.data import SPECIAL_TOKENS, make_encoding
from cram.files import read_ranks, write_ranks

TEXTS = ["The cat saw the river in the morning.", "  Indented,   spaced\ttabs\nand lines\n\n",
         "Ünïcödé — “quotes”, emoji 🙂 and 数字 1234567.", "it's we'll they've I'd", ""]


def trained(tmp_path, size=400):
    bpe = prepare.train_bpe(synthetic_corpus(200), size)
    ranks = prepare.bpe_ranks(bpe)
    special = {tok: len(ranks) + i for i, tok in enumerate(SPECIAL_TOKENS)}
    path = tmp_path / "tok.tiktoken"
    write_ranks(path, ranks)
    return bpe, make_encoding(read_ranks(path), special), special


def test_round_trip_and_special_ids(tmp_path):
    bpe, enc, special = trained(tmp_path)
    for text in TEXTS:
        assert enc.decode(enc.encode_ordinary(text)) == text
    assert enc.n_vocab == 400 + len(SPECIAL_TOKENS)
    assert list(special.values()) == [400, 401, 402, 403]
    assert all(enc.encode_single_token(tok) == i for tok, i in special.items())
    # raw text that spells a special token is ordinary text
    assert max(enc.encode_ordinary("[SEP] [MASK]")) < 400


def test_tiktoken_ids_match_the_trained_bpe(tmp_path):
    bpe, enc, _ = trained(tmp_path)
    for text in TEXTS + synthetic_corpus(50, seed=1):
        assert enc.encode_ordinary(text) == bpe.encode(text).ids


def test_bpe_learns_frequent_words(tmp_path):
    _, enc, _ = trained(tmp_path)
    assert len(enc.encode_ordinary(" the garden")) == 2
