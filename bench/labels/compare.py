"""Tempo, key and meter: Ostinato's analysis beside librosa's and essentia's, on a set
with known answers (make_set.py), each tool run the way its users run it.

    python compare.py SET_DIR OSTINATO_BINARY [--jobs 1]

Prints, per tool: tempo accuracy (within 4%; and allowing double, half, triple and a
third), key by the MIREX weighted score (mir_eval), meter accuracy (ACE-Step's
numerator), and seconds per song; then the same split by drums / no drums and by meter.

- librosa 0.11: `librosa.feature.tempo` on `onset_strength` (its default tempo); key by
  the common recipe, the mean `chroma_cqt` correlated with the Krumhansl-Kessler
  profiles (librosa has no key function). librosa has no meter estimate.
- essentia: `RhythmExtractor2013(method="multifeature")` for tempo; `KeyExtractor()`
  (its defaults) for key; meter through `BeatsLoudness` -> `Beatogram` -> `Meter`, the
  chain its docs give (the `Meter` algorithm is marked experimental).
- Ostinato: `ostinato label SET_DIR --json`. A field it cannot tell counts as wrong.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

NAMES = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"]
ALIASES = {"Db": "C#", "D#": "Eb", "Gb": "F#", "G#": "Ab", "A#": "Bb", "Cb": "B", "Fb": "E", "E#": "F", "B#": "C"}
# Krumhansl-Kessler probe-tone profiles, tonic first.
KK_MAJOR = [6.35, 2.23, 3.48, 2.33, 4.38, 4.09, 2.52, 5.19, 2.39, 3.66, 2.29, 2.88]
KK_MINOR = [6.33, 2.68, 3.52, 5.38, 2.60, 3.53, 2.54, 4.75, 3.98, 2.69, 3.34, 3.17]


def norm_key(text):
    """'F# minor' -> 'F# minor' in NAMES' spelling (mir_eval reads sharps and flats)."""
    if not text:
        return None
    tonic, mode = text.split()
    tonic = ALIASES.get(tonic.replace("♯", "#").replace("♭", "b"), tonic.replace("♯", "#").replace("♭", "b"))
    return f"{tonic} {mode.lower()}"


def tempo_ok(est, ref, factors):
    return est is not None and any(abs(est - ref * f) <= 0.04 * ref * f for f in factors)


def librosa_estimate(path):
    import librosa

    y, sr = librosa.load(path, sr=22050, mono=True)
    onset = librosa.onset.onset_strength(y=y, sr=sr)
    bpm = float(librosa.feature.tempo(onset_envelope=onset, sr=sr)[0])
    chroma = librosa.feature.chroma_cqt(y=y, sr=sr).mean(axis=1)
    best, key = -2.0, None
    for mode, profile in (("major", KK_MAJOR), ("minor", KK_MINOR)):
        for tonic in range(12):
            r = np.corrcoef(chroma, np.roll(profile, tonic))[0, 1]
            if r > best:
                best, key = r, f"{NAMES[tonic]} {mode}"
    return {"bpm": bpm, "keyscale": key, "timesignature": None}


def essentia_estimate(path):
    import essentia.standard as es

    audio = es.MonoLoader(filename=str(path), sampleRate=44100)()
    bpm, beats, _, _, _ = es.RhythmExtractor2013(method="multifeature")(audio)
    key, scale, _ = es.KeyExtractor()(audio)
    meter = None
    try:
        loudness, ratio = es.BeatsLoudness(beats=beats, sampleRate=44100)(audio)
        meter = int(round(es.Meter()(es.Beatogram()(loudness, ratio))))
    except Exception as e:  # the experimental chain fails on some songs
        print(f"essentia meter failed on {path.name}: {e}", file=sys.stderr)
    return {"bpm": float(bpm), "keyscale": f"{key} {scale}", "timesignature": meter}


def ostinato_estimates(set_dir, binary):
    start = time.perf_counter()
    out = subprocess.run([binary, "label", str(set_dir), "--json"], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return {Path(r["file"]).name: r for r in rows}, seconds


def score(answers, estimates):
    import mir_eval

    rows = []
    for a in answers:
        e = estimates.get(a["file"], {})
        est_key = norm_key(e.get("keyscale"))
        ref_key = norm_key(a["keyscale"])
        rows.append({
            "acc1": tempo_ok(e.get("bpm"), a["bpm"], [1]),
            "acc2": tempo_ok(e.get("bpm"), a["bpm"], [1, 2, 0.5, 3, 1 / 3]),
            "key": mir_eval.key.weighted_score(ref_key, est_key) if est_key else 0.0,
            "key_exact": est_key == ref_key,
            "meter": e.get("timesignature") is not None and int(e["timesignature"]) == a["timesignature"],
            "drums": a["drums"],
            "ts": a["timesignature"],
        })
    return rows


def summary(rows):
    n = len(rows)
    if n == 0:
        return "-"
    mean = lambda k: sum(float(r[k]) for r in rows) / n
    return (f"n={n:3d}  tempo acc1 {mean('acc1'):5.1%}  acc2 {mean('acc2'):5.1%}  "
            f"key MIREX {mean('key'):5.1%} (exact {mean('key_exact'):5.1%})  meter {mean('meter'):5.1%}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set_dir", type=Path)
    parser.add_argument("ostinato", type=Path)
    parser.add_argument("--skip", nargs="*", default=[], help="tools not to run: librosa essentia")
    args = parser.parse_args()
    answers = json.loads((args.set_dir / "answers.json").read_text())
    results = {}
    ours, seconds = ostinato_estimates(args.set_dir, args.ostinato)
    results["ostinato"] = (ours, seconds / len(answers))
    for name, estimate in (("librosa", librosa_estimate), ("essentia", essentia_estimate)):
        if name in args.skip:
            continue
        estimates, times = {}, []
        for a in answers:
            start = time.perf_counter()
            estimates[a["file"]] = estimate(args.set_dir / a["file"])
            times.append(time.perf_counter() - start)
        results[name] = (estimates, statistics.median(times))
    for name, (estimates, per_song) in results.items():
        rows = score(answers, estimates)
        print(f"{name:9s} {summary(rows)}  {per_song:.2f} s/song")
        for label, part in (("drums", [r for r in rows if r["drums"]]), ("no drums", [r for r in rows if not r["drums"]])):
            print(f"  {label:9s} {summary(part)}")
        for ts in (3, 4, 6):
            print(f"  meter {ts}   {summary([r for r in rows if r['ts'] == ts])}")
    wrong = [(a, ours.get(a["file"], {})) for a in answers]
    print("\nOstinato's misses (file: answer -> estimate):")
    for a, e in wrong:
        misses = []
        if not tempo_ok(e.get("bpm"), a["bpm"], [1]):
            misses.append(f"bpm {a['bpm']} -> {e.get('bpm')}")
        if norm_key(e.get("keyscale")) != norm_key(a["keyscale"]):
            misses.append(f"key {a['keyscale']} -> {e.get('keyscale')}")
        if e.get("timesignature") != a["timesignature"]:
            misses.append(f"meter {a['timesignature']} -> {e.get('timesignature')}")
        if misses:
            print(f"  {a['file']} ({'drums' if a['drums'] else 'no drums'}): {', '.join(misses)}")


if __name__ == "__main__":
    main()
