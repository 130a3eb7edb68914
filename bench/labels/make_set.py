"""Songs with known tempo, key and meter, for measuring tempo, key and meter estimates.

Each song is a MIDI file written here (drums, bass, chords and a melody in one key and
meter, at one tempo) rendered with FluidSynth and Debian's General MIDI soundfont
(fluid-soundfont-gm). answers.json holds what each song is: bpm, tonic, mode,
timesignature (ACE-Step's numerator: 3, 4 or 6) and whether it has drums.

Tempo is counted in the beat a musician counts: quarter notes in 3/4 and 4/4, dotted
quarters in 6/8. Every tonic appears in both modes; a quarter of the songs have no drums.

    python make_set.py OUT_DIR [--count 144] [--seconds 30] [--seed 1] [--ogg]

With --ogg each song is written as a mono Ogg Vorbis file (small enough to commit:
the CI test's known-answer clips are made so).
"""

import argparse
import json
import math
import random
import subprocess
from pathlib import Path

import mido
import soundfile

SOUNDFONT = "/usr/share/sounds/sf2/FluidR3_GM.sf2"
TICKS = 480  # per quarter note
NAMES = ["C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B"]
MAJOR = [0, 2, 4, 5, 7, 9, 11]
MINOR = [0, 2, 3, 5, 7, 8, 10]
# Progressions as scale degrees (0 = tonic); minor ones use the natural minor's chords,
# with a major dominant (raised 7th) where marked "V".
PROGRESSIONS = {
    "major": [[0, 4, 5, 3], [0, 3, 4, 0], [5, 3, 0, 4], [0, 5, 3, 4], [0, 3, 0, 4]],
    "minor": [[0, 5, 2, 6], [0, 3, "V", 0], [0, 6, 5, "V"], [0, 3, 0, "V"], [0, 5, 3, "V"]],
}
CHORD_PROGRAMS = [0, 4, 16, 24, 48, 89]  # piano, e-piano, organ, guitar, strings, pad
BASS_PROGRAMS = [32, 33, 34, 38]
MELODY_PROGRAMS = [73, 40, 56, 65, 0, 11, 80]
KICK, SNARE, HAT, RIDE, CRASH = 36, 38, 42, 51, 49


def chord_notes(tonic, mode, degree):
    """Pitch classes (as semitones above C) of the triad on `degree`."""
    scale = MAJOR if mode == "major" else MINOR
    if degree == "V":  # harmonic minor's dominant
        return [(tonic + 7) % 12, (tonic + 11) % 12, (tonic + 2) % 12]
    return [(tonic + scale[(degree + k) % 7]) % 12 for k in (0, 2, 4)]


def meter_grid(ts):
    """(eighths per bar, eighths per beat) of a meter."""
    return {3: (6, 2), 4: (8, 2), 6: (6, 3)}[ts]


class Track:
    """Note events of one channel, in ticks, turned into a MIDI track."""

    def __init__(self, channel, program):
        self.channel, self.program, self.events = channel, program, []

    def note(self, start, length, pitch, velocity):
        velocity = max(1, min(127, int(velocity)))
        self.events.append((start, 1, pitch, velocity))
        self.events.append((start + max(1, length), 0, pitch, 0))

    def midi(self):
        track = mido.MidiTrack()
        if self.channel != 9:
            track.append(mido.Message("program_change", channel=self.channel, program=self.program, time=0))
        now = 0
        for at, on, pitch, velocity in sorted(self.events, key=lambda e: (e[0], e[1])):
            kind = "note_on" if on else "note_off"
            track.append(mido.Message(kind, channel=self.channel, note=pitch, velocity=velocity, time=at - now))
            now = at
        return track


def song(rng, ts, tonic, mode, drums, seconds):
    eighth = TICKS // 2
    per_bar, per_beat = meter_grid(ts)
    beats_per_bar = per_bar // per_beat
    # The counted beat's tempo: quarters 60-180, dotted quarters 60-120 (log-uniform).
    low, high = (60, 120) if ts == 6 else (60, 180)
    bpm = round(math.exp(rng.uniform(math.log(low), math.log(high))))
    # MIDI tempo is in quarter notes: a dotted quarter is 1.5 of them.
    quarter_bpm = bpm * 1.5 if ts == 6 else bpm
    beat_seconds = 60.0 / bpm
    bars = max(2, int(seconds / (beat_seconds * beats_per_bar)))
    bar_ticks = per_bar * eighth
    progression = rng.choice(PROGRESSIONS[mode])
    chords = Track(0, rng.choice(CHORD_PROGRAMS))
    bass = Track(1, rng.choice(BASS_PROGRAMS))
    melody = Track(2, rng.choice(MELODY_PROGRAMS))
    kit = Track(9, 0)
    scale = MAJOR if mode == "major" else MINOR
    scale_pcs = [(tonic + s) % 12 for s in scale]
    melody_pitch = 72 + tonic - 12 * (tonic > 6)
    comp_style = rng.choice(["block", "beats", "arpeggio"])
    for bar in range(bars):
        degree = progression[bar % len(progression)]
        # The last bar returns home.
        if bar == bars - 1:
            degree = 0
        pcs = chord_notes(tonic, mode, degree)
        start = bar * bar_ticks
        root = 36 + pcs[0] if pcs[0] < 7 else 24 + pcs[0]
        voicing = sorted(60 + pc - 12 * (pc > 7) for pc in pcs)
        # Chords.
        if comp_style == "block":
            for n in voicing:
                chords.note(start, bar_ticks - 10, n, 70 + rng.randint(-8, 8))
        elif comp_style == "beats":
            for beat in range(beats_per_bar):
                accent = 12 if beat == 0 else 0
                if ts == 3 and beat == 0:
                    continue  # oom-pah-pah: the bass takes the one
                for n in voicing:
                    chords.note(start + beat * per_beat * eighth, per_beat * eighth - 20, n, 62 + accent + rng.randint(-6, 6))
        else:
            for e in range(per_bar):
                n = voicing[e % 3] + (12 if e % 6 >= 3 else 0)
                chords.note(start + e * eighth, eighth * 2, n, (72 if e == 0 else 58) + rng.randint(-6, 6))
        # Bass: the root on the one, the fifth on the bar's other strong beat.
        bass.note(start, per_beat * eighth * (2 if ts == 4 else 1) - 20, root, 95 + rng.randint(-5, 5))
        if ts == 4:
            bass.note(start + 4 * eighth, 4 * eighth - 20, root + 7, 85 + rng.randint(-5, 5))
        elif ts == 6:
            bass.note(start + 3 * eighth, 3 * eighth - 20, root + 7, 85 + rng.randint(-5, 5))
        else:
            bass.note(start + 2 * eighth, 2 * eighth - 20, root + 7, 75 + rng.randint(-5, 5))
            bass.note(start + 4 * eighth, 2 * eighth - 20, root + 7, 75 + rng.randint(-5, 5))
        # Melody: chord tones on beats, scale steps between, some rests.
        e = 0
        while e < per_bar:
            length = rng.choice([1, 1, 2, 2, 3] if ts == 6 else [1, 1, 2, 2, 4])
            length = min(length, per_bar - e)
            if rng.random() < 0.12:
                e += length
                continue
            on_beat = e % per_beat == 0
            if on_beat:
                target = rng.choice(pcs)
            else:
                target = rng.choice(scale_pcs)
            candidates = [p for p in range(melody_pitch - 7, melody_pitch + 8) if p % 12 == target]
            pitch = min(candidates, key=lambda p: abs(p - melody_pitch) + rng.random())
            melody_pitch = min(max(pitch, 62), 84)
            melody.note(start + e * eighth, length * eighth - 15, pitch, (90 if on_beat else 76) + rng.randint(-6, 6))
            e += length
        # Drums.
        if drums:
            if bar % 8 == 0:
                kit.note(start, eighth, CRASH, 90)
            hat = RIDE if rng.random() < 0.15 else HAT
            for e in range(per_bar):
                at = start + e * eighth
                velocity = 70 if e % per_beat == 0 else 52
                if ts == 4 and quarter_bpm > 150 and e % 2 == 1:
                    velocity = 0
                if velocity:
                    kit.note(at, eighth // 2, hat, velocity + rng.randint(-6, 6))
            if ts == 4:
                kicks, snares = [0, 4] + ([5] if rng.random() < 0.4 else []), [2, 6]
            elif ts == 3:
                kicks, snares = [0], [2, 4]
            else:
                kicks, snares = [0], [3]
            for k in kicks:
                kit.note(start + k * eighth, eighth // 2, KICK, 105 + rng.randint(-5, 5))
            for s in snares:
                kit.note(start + s * eighth, eighth // 2, SNARE, (95 if ts != 3 else 70) + rng.randint(-6, 6))
    # A final tonic chord held, so every song ends at home.
    end = bars * bar_ticks
    for n in sorted(60 + pc - 12 * (pc > 7) for pc in chord_notes(tonic, mode, 0)):
        chords.note(end, 2 * TICKS, n, 70)
    bass.note(end, 2 * TICKS, 36 + tonic if tonic < 7 else 24 + tonic, 90)

    mid = mido.MidiFile(ticks_per_beat=TICKS)
    meta = mido.MidiTrack()
    meta.append(mido.MetaMessage("set_tempo", tempo=mido.bpm2tempo(quarter_bpm), time=0))
    numerator, denominator = {3: (3, 4), 4: (4, 4), 6: (6, 8)}[ts]
    meta.append(mido.MetaMessage("time_signature", numerator=numerator, denominator=denominator, time=0))
    mid.tracks.append(meta)
    for track in (chords, bass, melody) + ((kit,) if drums else ()):
        mid.tracks.append(track.midi())
    return mid, bpm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=144)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=int, default=44100)
    parser.add_argument("--ogg", action="store_true", help="mono Ogg Vorbis files, without the MIDI")
    parser.add_argument("--indices", help="only these songs of the set, e.g. 0,24,48 (each song is made from the seed and its index alone)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    answers = []
    indices = [int(i) for i in args.indices.split(",")] if args.indices else range(args.count)
    for i in indices:
        rng = random.Random(f"{args.seed}-{i}")
        # Every tonic in both modes, cycling; 4/4, 3/4 and 6/8 by turns of 24 songs.
        tonic, mode = i % 12, ["major", "minor"][(i // 12) % 2]
        ts = [4, 3, 6][(i // 24) % 3]
        drums = rng.random() >= 0.25
        mid, bpm = song(rng, ts, tonic, mode, drums, args.seconds)
        name = f"song-{args.seed}-{i:03d}"
        mid_path = args.out / f"{name}.mid"
        mid.save(mid_path)
        wav = args.out / f"{name}.wav"
        subprocess.run(
            ["fluidsynth", "-ni", "-q", "-g", "0.6", "-r", str(args.rate), "-F", str(wav), SOUNDFONT, str(mid_path)],
            check=True,
        )
        if args.ogg:
            audio, rate = soundfile.read(wav)
            ogg = wav.with_suffix(".ogg")
            soundfile.write(ogg, audio.mean(axis=1), rate, format="OGG", subtype="VORBIS")
            wav.unlink()
            mid_path.unlink()
            wav = ogg
        answers.append({
            "file": wav.name, "bpm": bpm, "tonic": NAMES[tonic], "mode": mode,
            "keyscale": f"{NAMES[tonic]} {mode}", "timesignature": ts, "drums": drums,
            "seconds": soundfile.info(wav).duration,
        })
    (args.out / "answers.json").write_text(json.dumps(answers, indent=1))
    print(f"{len(answers)} songs in {args.out}")


if __name__ == "__main__":
    main()
