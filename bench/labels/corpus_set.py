"""Songs nobody here made, with the tempo, key and meter their encoders wrote down: pieces
from the corpus that ships in music21's wheel (PyPI), rendered by three synthesizer and
soundfont pairs, for measuring tempo, key and meter estimates (compare.py).

    python corpus_set.py OUT_DIR --source chorales [--count 48] [--seed 1]

Sources (each its own collection, transcribed by different people):
- chorales: J. S. Bach's four-part chorales, MusicXML from jsbchorales.net (Margaret
  Greentree), each with its notated key and mode, meter and a quarter-note tempo.
- oneills: O'Neill's Music of Ireland (1903), ABC transcribed by Norbert Paap: melodies.
- ryans: Ryan's Mammoth Collection (Boston, 1883), ABC contributed by Ray Davies and
  others: melodies.
- airds: James Aird's Selection of Scotch, English, Irish and Foreign Airs (1778), ABC
  transcribed by Jack Campin: melodies.

The compositions are public domain; the encodings are distributed in music21's corpus
with their encoders' permission, for research and non-commercial use
(music21/corpus/license.txt). Nothing of them is committed: the sets are made here.

Answers (answers.json, read by compare.py), from the encoding, never from the audio:
- keyscale: the key and mode written (ABC's K: field, MusicXML's <key><mode>). Pieces in
  a church mode (dorian, mixolydian, ...) or with no mode are left out: ACE-Step's
  keyscale is major or minor.
- timesignature: ACE-Step's numerator for the written meter: 2/4, 4/4, C, 2/2 and C| are
  4 (a bar of two beats is written 4, as Ostinato writes it; compare.py counts 2 and 4
  alike for every tool), 3/4 is 3, 6/8 is 6. Pieces in other meters, or that change
  meter, are left out.
- bpm: the beat a musician counts (the quarter in 2/4, 3/4 and 4/4, the half in 2/2, the
  dotted quarter in 6/8), at the tempo the piece is rendered: the chorales' own marking;
  for the tunes, their Q: field where they have one, else drawn from the seed in the
  range such a tune is played in.

Each piece is rendered whole, repeats played (`full/`), and a 12 s clip is cut from it
at a point drawn from the seed (`12s/`), each folder with its answers.json. Renderers,
one per piece in turn: FluidSynth with FluidR3 (fluid-soundfont-gm), FluidSynth with
MuseScore General (musescore-general-soundfont), TiMidity++ with FreePats (freepats).
"""

import argparse
import json
import random
import re
import subprocess
import tempfile
from pathlib import Path

import mido
import numpy as np
import soundfile

RENDERERS = {
    "fluidsynth-fluidr3": ["fluidsynth", "-ni", "-q", "-g", "0.5", "-r", "44100", "-F", "{wav}",
                           "/usr/share/sounds/sf2/FluidR3_GM.sf2", "{mid}"],
    "fluidsynth-musescore": ["fluidsynth", "-ni", "-q", "-g", "0.5", "-r", "44100", "-F", "{wav}",
                             "/usr/share/sounds/sf3/MuseScore_General.sf3", "{mid}"],
    "timidity-freepats": ["timidity", "-idq", "-Ow", "--output-stereo", "-s", "44100", "-o", "{wav}", "{mid}"],
}
# General MIDI programs that all three renderers have (FreePats has a subset).
ENSEMBLES = {"organ": [19], "strings": [40, 40, 42, 42], "piano": [0], "voices": [53], "brass": [56, 60, 57, 58],
             "harpsichord": [6], "winds": [73, 68, 71, 70]}
MELODY = [40, 73, 21, 0, 46, 24, 74, 6]
# The counted beat in quarter notes, and the numerator ACE-Step writes, per written meter.
METERS = {"2/4": (1.0, 4), "4/4": (1.0, 4), "C": (1.0, 4), "2/2": (2.0, 4), "C|": (2.0, 4),
          "3/4": (1.0, 3), "6/8": (1.5, 6)}
# Counted-beat tempos a tune in each meter is played at (dance and air alike).
TUNE_BPM = {4: (72, 126), 3: (84, 150), 6: (72, 116)}
CLIP_SECONDS = 12.0
ABC_SOURCES = {"oneills": "oneills1850", "ryans": "ryansMammoth", "airds": "airdsAirs"}


def corpus_dir():
    import music21

    return Path(music21.__file__).parent / "corpus"


def abc_key(field):
    """'Gm' -> ('G', 'minor'); 'D' -> ('D', 'major'); modal or unusual -> None."""
    m = re.fullmatch(r"\s*([A-G])([#b]?)\s*(m|min|minor|maj|major)?\s*", field.split("%")[0])
    if not m:
        return None
    mode = "minor" if m.group(3) in ("m", "min", "minor") else "major"
    return f"{m.group(1)}{m.group(2)}", mode


def abc_tunes(source):
    """(name, title, abc text, meter, key, quarter-note Q tempo or None) for each tune of an
    ABC source in one meter and a major or minor key."""
    for path in sorted((corpus_dir() / ABC_SOURCES[source]).glob("*.abc")):
        text = path.read_text(encoding="latin-1")
        for chunk in re.split(r"\n(?=X:)", text):
            if not chunk.startswith("X:"):
                continue
            head = {}
            for line in chunk.splitlines():
                m = re.match(r"([A-Z]):\s*(.*)", line)
                if m and m.group(1) not in head:
                    head[m.group(1)] = m.group(2).strip()
                if line.startswith("K:"):
                    break
            body = chunk.split("\nK:", 1)[-1]
            if re.search(r"(^|\n)M:|\[M:", body):  # the meter changes inside the tune
                continue
            if re.search(r"(^|\n)V:|\[V:", body):  # voices music21's ABC reader runs end to end
                continue
            key = abc_key(head.get("K", ""))
            meter = head.get("M", "").replace(" ", "")
            if key is None or meter not in METERS:
                continue
            # Q:1/2=72 is 72 half notes a minute; the quarter-note tempo is what is kept.
            q = re.fullmatch(r"(\d+)/(\d+)=(\d+)", head.get("Q", "").replace(" ", ""))
            quarter_bpm = int(q.group(3)) * 4 * int(q.group(1)) / int(q.group(2)) if q else None
            yield f"{path.stem}-{head.get('X', '?').strip()}", head.get("T", "?"), chunk, meter, key, quarter_bpm


def chorales():
    """Each chorale's file; its meter, key and tempo are read when it is parsed."""
    for path in sorted((corpus_dir() / "bach").glob("bwv*.mxl")):
        yield path.stem, path.stem, path, None, None, None


def chorale_facts(score):
    """(meter, (tonic, mode), quarter bpm) where the chorale has one of each, else None."""
    from music21 import key, meter, tempo

    keys = {(k.tonic.name, k.mode) for k in score.recurse().getElementsByClass(key.Key)}
    meters = {t.ratioString for t in score.recurse().getElementsByClass(meter.TimeSignature)}
    marks = {round(m.getQuarterBPM()) for m in score.recurse().getElementsByClass(tempo.MetronomeMark)
             if m.getQuarterBPM()}
    if len(keys) != 1 or len(meters) != 1 or len(marks) != 1:
        return None
    (tonic, mode), = keys
    (written,), (bpm,) = meters, marks
    if mode not in ("major", "minor") or written not in METERS:
        return None
    return written, (tonic.replace("-", "b"), mode), bpm


def write_midi(score, programs, quarter_bpm, path):
    """The score as MIDI at one tempo, its parts on the given programs."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.mid"
        score.write("midi", fp=str(raw))
        mid = mido.MidiFile(str(raw))
    channels = sorted({m.channel for t in mid.tracks for m in t if hasattr(m, "channel")} - {9})
    for track in mid.tracks:
        kept, carry = [], 0
        for msg in track:
            if msg.type in ("set_tempo", "program_change") or getattr(msg, "channel", None) == 9:
                carry += msg.time
                continue
            kept.append(msg.copy(time=msg.time + carry))
            carry = 0
        track[:] = kept
    first = mid.tracks[0]
    first.insert(0, mido.MetaMessage("set_tempo", tempo=round(60e6 / quarter_bpm), time=0))
    for i, ch in enumerate(channels):
        first.insert(1, mido.Message("program_change", channel=ch, program=programs[i % len(programs)], time=0))
    mid.save(str(path))


def render(renderer, mid, wav):
    cmd = [a.format(mid=mid, wav=wav) for a in RENDERERS[renderer]]
    # A render that has not ended in two minutes never will (FluidSynth waits on a voice
    # that does not decay): the piece is left out.
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    audio, rate = soundfile.read(str(wav), always_2d=True)
    # Trim the synthesizers' silent tail (reverb decays past the last note).
    loud = np.flatnonzero(np.abs(audio).max(axis=1) > 1e-3)
    if loud.size == 0:
        raise ValueError("silent render")
    audio = audio[: loud[-1] + rate // 2]
    audio = 0.8 * audio / np.abs(audio).max()
    soundfile.write(str(wav), audio, rate, subtype="PCM_16")
    return audio, rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", required=True, choices=["chorales", *ABC_SOURCES])
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    from music21 import converter

    rng = random.Random(f"{args.source}-{args.seed}")
    pieces = list(chorales() if args.source == "chorales" else abc_tunes(args.source))
    rng.shuffle(pieces)
    for sub in ("full", "12s"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    answers = {"full": [], "12s": []}
    renderers = list(RENDERERS)
    for name, title, data, written, tonality, bpm in pieces:
        if len(answers["full"]) >= args.count:
            break
        try:
            score = converter.parse(data) if args.source == "chorales" else converter.parseData(data, format="abc")
            if args.source == "chorales":
                facts = chorale_facts(score)
                if facts is None:
                    continue
                written, tonality, bpm = facts
            try:
                score = score.expandRepeats()
            except Exception:  # broken repeat marks: the tune once through
                pass
        except Exception as e:
            print(f"skipped {name}: {e}")
            continue
        beat, numerator = METERS[written]
        if args.source == "chorales":
            counted = bpm / beat
        else:
            counted = bpm / beat if bpm else rng.uniform(*TUNE_BPM[numerator])
        programs = (rng.choice(list(ENSEMBLES.values())) if args.source == "chorales" else [rng.choice(MELODY)])
        renderer = renderers[len(answers["full"]) % len(renderers)]
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        mid = args.out / f"{stem}.mid"
        wav = args.out / "full" / f"{stem}.wav"
        try:
            write_midi(score, programs, counted * beat, mid)
            audio, rate = render(renderer, mid, wav)
        except Exception as e:
            print(f"skipped {name}: {e}")
            continue
        finally:
            mid.unlink(missing_ok=True)
        seconds = len(audio) / rate
        if seconds < CLIP_SECONDS + 2:
            wav.unlink()
            continue
        answer = {"file": wav.name, "title": title, "bpm": round(counted, 2), "keyscale": " ".join(tonality),
                  "timesignature": numerator, "written": written, "drums": False, "renderer": renderer,
                  "programs": programs, "seconds": round(seconds, 2)}
        answers["full"].append(answer)
        start = int(rng.uniform(0, seconds - CLIP_SECONDS) * rate)
        soundfile.write(str(args.out / "12s" / wav.name), audio[start: start + int(CLIP_SECONDS * rate)], rate,
                        subtype="PCM_16")
        answers["12s"].append({**answer, "start": round(start / rate, 2), "seconds": CLIP_SECONDS})
        print(f"{len(answers['full']):3d} {name}: {answer['keyscale']}, {written}, {answer['bpm']} BPM, "
              f"{seconds:.0f} s, {renderer}")
    for sub, rows in answers.items():
        (args.out / sub / "answers.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
