"""bench/summary's throughput rows: each weight format against vLLM's fastest dtype of the
same run and llama-cpp-python's single stream; a result without a baseline has no row."""

from bench.summary_engine import throughput_rows


def result(vllm: dict | None) -> dict:
    return {
        "workload": {"model": "m", "requests": 32},
        "ours_by_weights": {"blocks": {"tokens_per_s": 300.0}, "w8a8": {"tokens_per_s": 360.0}},
        "baselines": {"vllm": vllm},
        "single_stream": {
            "llamacpp": {"decode_tokens_per_s": 50.0},
            "blocks": {"decode_tokens_per_s": 150.0},
        },
    }


def test_each_format_against_the_fastest_vllm_dtype() -> None:
    vllm = {"bfloat16": {"tokens_per_s": 240.0}, "float32": {"tokens_per_s": 120.0}}
    rows = throughput_rows(result(vllm))
    assert rows == [
        ("m blocks: 32 concurrent, output tok/s (vLLM-CPU bfloat16)", "300.0", "240.0", "1.25x"),
        ("m blocks: one stream, decode tok/s (llama-cpp-python)", "150.0", "50.0", "3.00x"),
        ("m w8a8: 32 concurrent, output tok/s (vLLM-CPU bfloat16)", "360.0", "240.0", "1.50x"),
    ]


def test_without_vllm_only_the_single_stream_row() -> None:
    rows = throughput_rows(result(None))
    assert [r[0] for r in rows] == ["m blocks: one stream, decode tok/s (llama-cpp-python)"]
