"""What upstream's text2music "thinking" plans with the committed tiny 5 Hz LM.

Run through scripts/make-lm-plan-fixtures (ACESTEP_SRC must point at a checkout of
ace-step/ACE-Step-1.5). Reads engine/tests/fixtures/lm_tiny/acestep-5Hz-lm-tiny (made by
make_lm_fixtures.py, left unchanged) and writes engine/tests/fixtures/lm_tiny/plans.json:
for each request, upstream's greedy two-phase generation (LLMHandler.generate_with_stop_condition,
infer_type "llm_dit", the user metadata as inference.generate_music builds it): the ids each
phase generated, the metadata phase's text, the parsed metadata, the think block of the codes
prompt and the audio codes.

Everything LM-side is upstream's code, set up by its own initialize() (backend "pt", cpu);
this script only wraps the two decoding loops to keep the ids they return.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_lm_fixtures as base  # noqa: E402  (checks ACESTEP_SRC, imports upstream)

OUT = os.path.join(base.OUT, "plans.json")

# Each request: caption, lyrics, duration (s), the user's bpm / key / time signature, LM CFG scale.
REQUESTS = [
    {"name": "guided_nothing_given", "caption": "A warm calm piano song with soft vocals",
     "lyrics": "[Verse]\nLa la love in the rain\n", "duration": 12.0, "cfg_scale": 2.0},
    {"name": "unguided_bpm_and_key_given", "caption": "Fast driving rock with electric guitar",
     "lyrics": "", "duration": 10.6, "bpm": 128, "keyscale": "E minor", "cfg_scale": 1.0},
    {"name": "guided_all_given", "caption": "Ambient synth pads", "lyrics": "[Instrumental]",
     "duration": 14.0, "bpm": 90, "keyscale": "F# major", "timesignature": "3", "cfg_scale": 2.0},
]


def user_metadata(req):
    """inference.generate_music's user_metadata for these values."""
    meta = {}
    if req.get("bpm") is not None:
        meta["bpm"] = int(float(req["bpm"]))
    if req.get("keyscale"):
        meta["keyscale"] = req["keyscale"].strip()
    if req.get("timesignature"):
        meta["timesignature"] = req["timesignature"].strip()
    meta["duration"] = int(float(req["duration"]))
    return meta


def plan(handler, req):
    runs = []

    def keep(original, key):
        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            ids = kwargs.get("input_ids", kwargs.get("batch_input_ids"))
            runs.append(out[0, ids.shape[1]:].tolist())
            return out
        return wrapped

    handler._generate_with_constrained_decoding = keep(handler._generate_with_constrained_decoding, "input_ids")
    handler._generate_with_cfg_custom = keep(handler._generate_with_cfg_custom, "batch_input_ids")
    try:
        result = handler.generate_with_stop_condition(
            caption=req["caption"], lyrics=req["lyrics"], infer_type="llm_dit", temperature=0.0,
            cfg_scale=req["cfg_scale"], negative_prompt="NO USER INPUT", top_k=None, top_p=None,
            target_duration=req["duration"], user_metadata=user_metadata(req),
        )
    finally:
        del handler._generate_with_constrained_decoding
        del handler._generate_with_cfg_custom
    assert result["success"], result["error"]
    tok = handler.llm_tokenizer
    skipped = handler.has_all_metas(user_metadata(req))
    metadata_ids = [] if skipped else runs[0]
    codes_ids = runs[-1]
    codes = [int(c) for c in __import__("re").findall(r"<\|audio_code_(\d+)\|>", result["audio_codes"])]
    metadata = result["metadata"]
    return {
        **req,
        "user_metadata": user_metadata(req),
        "metadata_skipped": skipped,
        "metadata_ids": metadata_ids,
        "metadata_text": tok.decode(metadata_ids, skip_special_tokens=False) if metadata_ids else None,
        "metadata": {k: str(v) for k, v in metadata.items()},
        "cot": handler._format_metadata_as_cot(metadata),
        "codes_ids": codes_ids,
        "codes": codes,
    }


def main():
    handler = base.make_handler()
    # No genres vocabulary (upstream ships none), as for make_lm_fixtures' plain run.
    base.use_genres_vocab(handler, os.path.join(base.OUT, "no-such-genres-vocab.txt"))
    plans = []
    for req in REQUESTS:
        p = plan(handler, req)
        print(f"{p['name']}: {len(p['metadata_ids'])} metadata tokens, {len(p['codes'])} codes; "
              f"metadata {p['metadata']}\n  cot {p['cot']!r}")
        plans.append(p)
    expected = {
        "plans": plans,
        "notes": [
            "Greedy (temperature 0), top-k/top-p off; cfg_scale as each request says; "
            "negative prompt upstream's default. The handler's processor is made as initialize() "
            "makes it, with no genres vocabulary.",
            "metadata_ids: what phase 1 generated (the end token in place of </think>); codes_ids: "
            "what phase 2 generated (audio codes, then the end token).",
        ],
        "upstream": {"repo": "ace-step/ACE-Step-1.5", "commit": base.upstream_commit()},
    }
    with open(OUT, "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
