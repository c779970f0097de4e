import re

import pytest

from rlvr.data.arith import make_splits
from rlvr.data.dataset import DataSource, read_prompts, render_prompt
from rlvr.core.errors import DataError
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
        a, op, b = re.fullmatch(r"(\d\d)([+-])(\d\d)=", row["prompt"]).groups()  # fixed width
        assert row["label"] == f"{int(a) + int(b) if op == '+' else int(a) - int(b):03d}"


# ---- formats, documented bad-input behaviour, streaming ------------------------------------
from rlvr.data.dataset import PromptDataset  # noqa: E402


def _rows(n, **extra):
    return [{"prompt": f"{i}+1=", "label": str(i + 1), "metadata": {"source_name": "a" if i % 2 else "b"}, **extra}
            for i in range(n)]


def test_parquet_and_datasets_directory_read_like_jsonl(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(25)
    jsonl = PromptDataset(write_lines(tmp_path / "d.jsonl", rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=4)  # 7 row groups
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hfdir"))
    for path in (tmp_path / "d.parquet", tmp_path / "hfdir"):
        ds = PromptDataset(path)
        assert len(ds) == 25
        assert [(r.index, r.prompt, r.label, r.metadata) for r in ds] == [
            (r.index, r.prompt, r.label, r.metadata) for r in jsonl]
        assert ds[13].prompt == "13+1=" and ds[3].prompt == "3+1="  # random access, out of order


def test_parquet_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "1+1=", "label": "2"}]), tmp_path / "q.parquet")
    with pytest.raises(DataError, match=r"q\.parquet: row 0: missing prompt field 'prompt' \(--input-key\)"):
        PromptDataset(tmp_path / "q.parquet")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable Parquet file"):
        PromptDataset(tmp_path / "bad.parquet")


def test_wrong_type_and_chat_messages(tmp_path, tiny_qwen2):
    from transformers import AutoTokenizer

    p = write_lines(tmp_path / "t.jsonl", [{"prompt": "ok", "label": 1}, {"prompt": 7, "label": 1}])
    with pytest.raises(DataError, match=r"t\.jsonl:2: field 'prompt' must be a string or a list of chat messages"):
        PromptDataset(p)
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4="}]
    p = write_lines(tmp_path / "c.jsonl", [{"prompt": chat, "label": "7"}])
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    assert PromptDataset(p)[0].prompt == chat
    text = render_prompt(chat, tok, apply_chat_template=True)
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n3+4=")
    # A chat prompt without --apply-chat-template cannot be rendered: named at load time.
    with pytest.raises(DataError, match=r"c\.jsonl:1: a chat-message prompt needs --apply-chat-template"):
        PromptDataset(p, tokenizer=tok, max_prompt_len=100)


def test_over_long_prompts_dropped_and_counted_never_truncated(tmp_path, tiny_qwen2, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    rows = [{"prompt": "1+1=", "label": "2"}, {"prompt": "9" * 50 + "=", "label": "x"}, {"prompt": "2+2=", "label": "4"}]
    p = write_lines(tmp_path / "l.jsonl", rows)
    limit = len(tok("1+1=", add_special_tokens=False)["input_ids"])
    ds = PromptDataset(p, tokenizer=tok, max_prompt_len=limit)
    assert [r.prompt for r in ds] == ["1+1=", "2+2="] and [r.index for r in ds] == [0, 2]
    assert ds.dropped_long == 1
    assert "dropped 1 of 3 prompts longer than --rollout-max-prompt-len" in caplog.text
    with pytest.raises(DataError, match="every prompt is longer than --rollout-max-prompt-len"):
        PromptDataset(p, tokenizer=tok, max_prompt_len=1)


def test_chat_template_kwargs_reach_the_template(tiny_qwen2, tmp_path):
    from transformers import AutoTokenizer

    from rlvr.runtime.configure import parse_config
    from rlvr.core.errors import ConfigError

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if greeting %}!{% endif %}"
    assert render_prompt("hi", tok, True, {"greeting": True}) == "hi!"
    assert render_prompt("hi", tok, True) == "hi"
    common = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(write_lines(tmp_path / "x.jsonl", _rows(1)))]
    assert parse_config(common + ["--apply-chat-template-kwargs", '{"greeting": true}']).data.chat_template_kwargs() == {
        "greeting": True}
    with pytest.raises(ConfigError, match="--apply-chat-template-kwargs: not valid JSON"):
        parse_config(common + ["--apply-chat-template-kwargs", "{greeting"])
    with pytest.raises(ConfigError, match="--prompt-data: .* not one written by datasets' save_to_disk"):
        parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(tmp_path)])


def test_streaming_keeps_rows_on_disk(tmp_path):
    """Only row offsets stay in memory: a row edited on disk after opening is read as edited
    (the reader seeks to it), and the shuffle is a permutation of positions, not of records."""
    p = write_lines(tmp_path / "s.jsonl", _rows(2000))
    ds = PromptDataset(p)
    assert not hasattr(ds, "records") and len(ds._kept) == 2000
    src = DataSource(ds, shuffle=True, seed=0)
    first = src.next_prompts(2000)
    assert sorted(r.index for r in first) == list(range(2000)) and [r.index for r in first] != list(range(2000))
    assert src._order.dtype.is_floating_point is False and src._order.numel() == 2000
    text = p.read_text()
    p.write_text(text.replace('"0+1="', '"X+1="', 1))  # same byte length: offsets still valid
    assert ds[0].prompt == "X+1="


def test_open_dataset_memory_is_independent_of_row_size(tmp_path):
    """A 40 MB JSONL file: what the opened dataset keeps is its offsets (16 bytes a row), not rows."""
    import tracemalloc

    p = tmp_path / "big.jsonl"
    pad = "x" * 2000
    with open(p, "w") as f:
        for i in range(20000):
            f.write(f'{{"prompt": "{i}+1=", "label": "{i + 1}", "pad": "{pad}"}}\n')
    tracemalloc.start()
    ds = PromptDataset(p)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(ds) == 20000 and p.stat().st_size > 40e6
    assert held < 1e6, f"opened dataset holds {held / 1e6:.1f} MB"


def test_per_source_metrics(tmp_path):
    from rlvr.observe.rollout_metrics import rollout_metrics
    from rlvr.core.types import Sample, Status

    samples = [Sample("p", [1], metadata={"source_name": "gsm8k"}, reward=1.0, response_ids=[1, 2]),
               Sample("p", [1], metadata={"source_name": "gsm8k"}, reward=0.0, response_ids=[1, 2, 3, 4],
                      status=Status.TRUNCATED),
               Sample("p", [1], metadata={"source_name": "math"}, reward=0.0, response_ids=[1])]
    m = rollout_metrics(samples, 1, prefix="rollout/")
    assert m["rollout/gsm8k/raw_reward"] == 0.5 and m["rollout/math/raw_reward"] == 0.0
    assert m["rollout/gsm8k/response_len/mean"] == 3.0 and m["rollout/gsm8k/truncated_ratio"] == 0.5
    assert m["rollout/gsm8k/count"] == 2.0 and m["rollout/response_len/median"] == 2.0
