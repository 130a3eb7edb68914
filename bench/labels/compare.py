"""Tempo, key and meter: Ostinato's analysis beside librosa's and essentia's, on a set
with known answers (make_set.py), each tool run the way its users run it.

    python compare.py SET_DIR OSTINATO_BINARY [--calibration] [--markdown] [--skip librosa essentia]

Prints, per tool: tempo accuracy (within 4%; and allowing double, half, triple and a
third), key by the MIREX weighted score (mir_eval), meter accuracy (ACE-Step's
numerator), and seconds per song; then the same split by drums / no drums and by meter.

- librosa 0.11: `librosa.feature.tempo` on `onset_strength` (its default tempo); key by
  the common recipe, the mean `chroma_cqt` correlated with the Krumhansl-Kessler
  profiles (librosa has no key function). librosa has no meter estimate.
- essentia: `RhythmExtractor2013(method="multifeature")` for tempo; `KeyExtractor()`
  (its defaults) for key; meter through `BeatsLoudness` -> `Beatogram` -> `Meter`, the
  chain its docs give (the `Meter` algorithm is marked experimental).
- Ostinato: `ostinato label SET_DIR --json`, its own readings ("analysed"), never
  labels kept from an earlier run. A field it cannot tell counts as wrong.
- "120 BPM, C major, 4/4": the answer a labeller that reads nothing would give.

Meter counts a bar of two beats and a bar of four alike (Ostinato writes both 4; essentia
may say 2). librosa's and essentia's estimates are kept in SET_DIR/estimates-TOOL.json
and reused (they do not change between runs; delete the file to run the tool again).
With --calibration, Ostinato's confidence against how often it is right, per field.
With --markdown, one table row per tool, as bench/NOTES.md has them.
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
    estimates = {}
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        read = row.get("analysed", {})
        estimates[Path(row["file"]).name] = {
            "bpm": read.get("bpm"), "keyscale": read.get("keyscale"), "timesignature": read.get("timesignature"),
            "confidence": row.get("confidence", {}),
        }
    return estimates, seconds


def cached_estimates(set_dir, answers, name, estimate):
    """A tool's estimates for every file of the set, run once and kept in the set."""
    path = set_dir / f"estimates-{name}.json"
    kept = json.loads(path.read_text()) if path.exists() else {"estimates": {}, "seconds": {}}
    for a in answers:
        if a["file"] not in kept["estimates"]:
            start = time.perf_counter()
            kept["estimates"][a["file"]] = estimate(set_dir / a["file"])
            kept["seconds"][a["file"]] = time.perf_counter() - start
    path.write_text(json.dumps(kept))
    return kept["estimates"], statistics.median(kept["seconds"][a["file"]] for a in answers)


def same_meter(est, ref):
    """Numerators equal, a bar of two beats counting as one of four."""
    duple = lambda n: 4 if n == 2 else n
    return est is not None and duple(int(est)) == duple(int(ref))


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
            "meter": same_meter(e.get("timesignature"), a["timesignature"]),
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


FIELDS = (("bpm", "tempo within 4%", "acc1"), ("keyscale", "key exact", "key_exact"),
          ("timesignature", "meter", "meter"))


def calibration(answers, rows, estimates):
    """How often Ostinato is right at each confidence, per field, and what it cannot tell."""
    print("\nOstinato's confidence against how often it is right:")
    for field, label, measure in FIELDS:
        pairs = [(estimates.get(a["file"], {}).get("confidence", {}).get(field), r[measure])
                 for a, r in zip(answers, rows)]
        told = [(c, ok) for c, ok in pairs if c is not None]
        cannot = len(pairs) - len(told)
        cells = []
        for lo, hi in ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.01)):
            part = [ok for c, ok in told if lo <= c < hi]
            cells.append(f"[{lo:.1f},{min(hi, 1.0):.1f}) {sum(part):3d}/{len(part):<3d}")
        sure = [ok for c, ok in told if c >= 0.8]
        sure_rate = f"{sum(sure) / len(sure):5.1%}" if sure else "  -  "
        print(f"  {label:16s} right at >= 0.8: {sure_rate} of {len(sure):3d}; cannot tell {cannot:3d};  "
              + "  ".join(cells))


def markdown(scored):
    print("\n| tool | tempo within 4% | tempo, octave errors allowed | key (MIREX) | key exact | meter |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rows in scored.items():
        mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)
        meter = f"{mean('meter'):.3f}" if name != "librosa" else "-"
        print(f"| {name} | {mean('acc1'):.3f} | {mean('acc2'):.3f} | {mean('key'):.3f} | "
              f"{mean('key_exact'):.3f} | {meter} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("set_dir", type=Path)
    parser.add_argument("ostinato", type=Path)
    parser.add_argument("--skip", nargs="*", default=[], help="tools not to run: librosa essentia")
    parser.add_argument("--calibration", action="store_true", help="Ostinato's confidence against its accuracy")
    parser.add_argument("--markdown", action="store_true", help="one table row per tool")
    args = parser.parse_args()
    answers = json.loads((args.set_dir / "answers.json").read_text())
    results = {}
    ours, seconds = ostinato_estimates(args.set_dir, args.ostinato)
    results["ostinato"] = (ours, seconds / len(answers))
    for name, estimate in (("librosa", librosa_estimate), ("essentia", essentia_estimate)):
        if name not in args.skip:
            results[name] = cached_estimates(args.set_dir, answers, name, estimate)
    constant = {"bpm": 120.0, "keyscale": "C major", "timesignature": 4}
    results["120 BPM, C major, 4/4"] = ({a["file"]: constant for a in answers}, 0.0)
    scored = {name: score(answers, estimates) for name, (estimates, _) in results.items()}
    for name, (_, per_song) in results.items():
        rows = scored[name]
        print(f"{name:9s} {summary(rows)}  {per_song:.2f} s/song")
        for label, part in (("drums", [r for r in rows if r["drums"]]), ("no drums", [r for r in rows if not r["drums"]])):
            if part and len(part) < len(rows):
                print(f"  {label:9s} {summary(part)}")
        for ts in (3, 4, 6):
            print(f"  meter {ts}   {summary([r for r in rows if r['ts'] == ts])}")
    if args.calibration:
        calibration(answers, scored["ostinato"], ours)
    if args.markdown:
        markdown(scored)
    print("\nOstinato's misses (file: answer -> estimate):")
    for a in answers:
        e = ours.get(a["file"], {})
        misses = []
        if not tempo_ok(e.get("bpm"), a["bpm"], [1]):
            misses.append(f"bpm {a['bpm']} -> {e.get('bpm')}")
        if norm_key(e.get("keyscale")) != norm_key(a["keyscale"]):
            misses.append(f"key {a['keyscale']} -> {e.get('keyscale')}")
        if not same_meter(e.get("timesignature"), a["timesignature"]):
            misses.append(f"meter {a['timesignature']} -> {e.get('timesignature')}")
        if misses:
            print(f"  {a['file']}: {', '.join(misses)}")


if __name__ == "__main__":
    main()
