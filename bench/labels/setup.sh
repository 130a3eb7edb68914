#!/usr/bin/env bash
# What the label bench needs: FluidSynth with the FluidR3 and MuseScore General soundfonts
# and TiMidity++ with FreePats (Debian), and a venv (bench/labels/.venv) with mido and
# soundfile (make_set.py), music21 and its corpus (corpus_set.py), and librosa, essentia
# and mir_eval (compare.py), all from PyPI.
#
#   bench/labels/setup.sh
#   .venv/bin/python make_set.py /tmp/dev --seed 1 && .venv/bin/python make_set.py /tmp/test --seed 2
#   .venv/bin/python compare.py /tmp/test target/release/ostinato
#   .venv/bin/python corpus_set.py /tmp/chorales --source chorales   (and oneills, ryans, airds)
#   .venv/bin/python compare.py /tmp/chorales/12s target/release/ostinato --calibration --markdown
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/../../scripts/install-debs" fluidsynth fluid-soundfont-gm musescore-general-soundfont timidity freepats
venv="${VENV:-$here/.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet "librosa==0.11.0" essentia "mir_eval==0.8.2" "mido==1.3.3" "soundfile==0.14.0" "music21==10.5.1"
"$venv/bin/python" -c "import librosa, essentia, mir_eval; print('librosa', librosa.__version__, 'essentia', essentia.__version__)"
