"""InferOptions: which of infer's options go together, checked when made, in the caller's
spelling (keywords from Python, flags on the command line)."""
from __future__ import annotations

import pytest

from vit_export.deploy.classify import InferOptions
from vit_export.errors import OptionError


@pytest.mark.parametrize("keywords, python, cli", [
    (dict(resume=True), "resume applies to ray only", "--resume applies to --ray only"),
    (dict(force=True), "force replaces output; there is none",
     "--force replaces --output; there is none"),
    (dict(ray=True), "ray needs output='FILE.jsonl' for its records",
     "--ray needs --output FILE.jsonl for its records"),
    (dict(embed=True, output="e.csv"), "output='e.csv': embeddings are written as FILE.npy",
     "--output e.csv: embeddings are written as FILE.npy or FILE.parquet"),
    (dict(ray=True, output="r.npy"), "output='r.npy': ray=True writes classes as JSON lines",
     "--output r.npy: --ray writes classes as JSON lines (FILE.jsonl)"),
    (dict(top_k=0), "top_k=0 is not an integer >= 1", "--top-k 0 is not an integer >= 1"),
    (dict(top_k="3"), "top_k='3' is not an integer >= 1", "--top-k 3 is not"),
    (dict(batch_size=-2), "batch_size=-2 is not an integer >= 1", "--batch-size -2 is not"),
    (dict(batch_size=None), "batch_size=None is not an integer >= 1", "--batch-size None"),
    (dict(workers=0), "workers=0 is not an integer >= 1", "--workers 0 is not"),
])
def test_each_rule_in_both_spellings(keywords, python, cli):
    with pytest.raises(OptionError) as caught:
        InferOptions(**keywords)
    assert str(caught.value).startswith(python)
    assert caught.value.cli_message() == cli or caught.value.cli_message().startswith(cli)


def test_what_goes_together_is_accepted():
    assert InferOptions(ray=True, output="r.jsonl", resume=True, workers=2).workers == 2
    assert InferOptions(embed=True, output="e.npy", force=True).output.name == "e.npy"


@pytest.mark.parametrize("keywords, said", [
    (dict(threads=0), "threads=0 is not an integer in [1, 1024]"),
    (dict(threads=5000), "threads=5000 is not an integer in [1, 1024]"),
    (dict(batch_size=0), "batch_size=0 is not an integer >= 1"),
])
def test_open_holds_its_numbers_to_the_flags_ranges(tmp_path, keywords, said):
    """Refused before the model (here, none) is read: the numbers infer's flags refuse."""
    import vit_export

    with pytest.raises(OptionError) as refused:
        vit_export.open(tmp_path / "nothing", **keywords)
    assert str(refused.value).startswith(said)
