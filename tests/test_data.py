import pytest

from rlvr.data.arith import make_splits
from rlvr.data.dataset import DataSource, read_prompts, render_prompt
from rlvr.errors import DataError
from tests.conftest import write_lines


def test_malformed_line_names_file_and_line(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [{"prompt": "1+1=", "label": "2"}, '{"prompt": "2+2=", "label": ', ""])
    with pytest.raises(DataError, match=r"d\.jsonl:2: not valid JSON"):
        read_prompts(p)


def test_missing_label_key_names_key_and_line(tmp_path):
    ok = write_lines(tmp_path / "ok.jsonl", [{"q": "1+1=", "answer": "2"}])
    assert read_prompts(ok, input_key="q", label_key="answer")[0].label == "2"
    p = write_lines(tmp_path / "d.jsonl", [{"q": "1+1=", "answer": "2"}, {"q": "3+3="}])
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing label field 'answer' \(--label-key\)"):
        read_prompts(p, input_key="q", label_key="answer")
    with pytest.raises(DataError, match=r"d\.jsonl:1: missing prompt field 'prompt' \(--input-key\)"):
        read_prompts(p)


def test_non_object_and_bad_metadata(tmp_path):
    with pytest.raises(DataError, match=r":1: expected a JSON object"):
        read_prompts(write_lines(tmp_path / "a.jsonl", ["[1, 2]"]))
    with pytest.raises(DataError, match=r":1: field 'metadata' \(--metadata-key\) must be an object"):
        read_prompts(write_lines(tmp_path / "b.jsonl", [{"prompt": "x", "label": 1, "metadata": 3}]))


def test_chat_template_applied(tiny_qwen2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    text = render_prompt("3+4=", tok, apply_chat_template=True)
    assert text == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("3+4=", tok, apply_chat_template=False) == "3+4="


def test_data_source_epochs_and_resume(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [{"prompt": str(i), "label": i} for i in range(5)])
    src = DataSource(read_prompts(p), shuffle=True, seed=3)
    first = [r.index for r in src.next_prompts(3)]
    state = src.state_dict()
    rest = [r.index for r in src.next_prompts(4)]  # crosses into epoch 1
    assert sorted(first + rest[:2]) == list(range(5))  # epoch 0 is a permutation
    again = DataSource(read_prompts(p), shuffle=True, seed=3)
    again.load_state_dict(state)
    assert [r.index for r in again.next_prompts(4)] == rest


def test_arith_splits_disjoint_and_deterministic():
    train, test = make_splits(n_test=300)
    assert len(test) == 300 and not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert make_splits(n_test=300) == (train, test)
    for row in test[:50]:
        expr = row["prompt"].rstrip("=")
        assert str(eval(expr)) == row["label"]  # noqa: S307 (our own digits and +/-)
