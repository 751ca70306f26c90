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
])
def test_each_rule_in_both_spellings(keywords, python, cli):
    with pytest.raises(OptionError) as caught:
        InferOptions(**keywords)
    assert str(caught.value).startswith(python)
    assert caught.value.cli_message() == cli or caught.value.cli_message().startswith(cli)


def test_what_goes_together_is_accepted():
    assert InferOptions(ray=True, output="r.jsonl", resume=True, workers=2).workers == 2
    assert InferOptions(embed=True, output="e.npy", force=True).output.name == "e.npy"
