use super::*;
use crate::data::testutil::{sine, write_file};
use crate::data::wav::{wav_bytes, SampleFormat};

const HEAD: Cut = Cut::Head { max_seconds: 240.0 };

/// Frequency by counting zero crossings; amplitude by RMS * sqrt(2).
fn freq_and_amp(x: &[f32], rate: u32) -> (f64, f64) {
    let crossings = x.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
    let freq = crossings as f64 * rate as f64 / x.len() as f64;
    let rms = (x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
    (freq, rms * 2f64.sqrt())
}

#[test]
fn resampling_keeps_frequency_amplitude_and_length() {
    for (from, to) in [(44_100, 48_000), (8_000, 48_000), (192_000, 48_000)] {
        let x = sine(1000.0, 0.5, from, from as usize * 2);
        let a = StereoAudio { sample_rate: from, left: x.clone(), right: x };
        let b = resample(&a, to).unwrap();
        assert_eq!(b.sample_rate, to);
        assert_eq!(b.frames(), (2 * to) as usize);
        assert_eq!(b.left, b.right);
        // Skip the edges, where the band-limited filter rings.
        let mid = &b.left[to as usize / 10..b.frames() - to as usize / 10];
        let (f, amp) = freq_and_amp(mid, to);
        assert!((f - 1000.0).abs() < 2.0, "{from}->{to}: {f} Hz");
        assert!((amp - 0.5).abs() < 0.01, "{from}->{to}: amplitude {amp}");
        // Aligned: the resampled sine matches the ideal one sample by sample.
        let ideal = sine(1000.0, 0.5, to, b.frames());
        let worst = mid.iter().zip(&ideal[to as usize / 10..]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 0.02, "{from}->{to}: off the ideal sine by {worst}");
    }
}

/// MP3, Ogg Vorbis, AAC and ALAC in M4A: small files ffmpeg made (see testdata/).
#[test]
fn compressed_formats_decode() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/testdata");
    for (name, rate) in
        [("tone.mp3", 44_100), ("tone.ogg", 32_000), ("tone_aac.m4a", 48_000), ("tone_alac.m4a", 16_000)]
    {
        let a = decode(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(a.sample_rate, rate, "{name}");
        assert!((a.duration_seconds() - 1.5).abs() < 0.05, "{name}: {} s", a.duration_seconds());
        let mid = |x: &[f32]| x[rate as usize / 4..rate as usize * 5 / 4].to_vec();
        for (channel, freq) in [(&a.left, 440.0), (&a.right, 660.0)] {
            let (f, amp) = freq_and_amp(&mid(channel), rate);
            assert!((f - freq).abs() < 3.0, "{name}: {f} Hz, want {freq}");
            assert!((amp - 0.125).abs() < 0.01, "{name}: amplitude {amp}");
        }
    }
}

/// A cut or a crop decodes only its own frames, exactly those of the whole file
/// decoded, and still tells the whole file's length (from the header, or counted
/// from the packets where the header states none).
#[test]
fn a_cut_decodes_its_frames_and_tells_the_length_of_the_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/testdata");
    // An Ogg stream without its last page states no length: it is counted.
    let tmp = tempfile::tempdir().unwrap();
    let ogg = std::fs::read(dir.join("tone.ogg")).unwrap();
    let last_page = ogg.windows(4).rposition(|w| w == b"OggS").unwrap();
    let unstated = write_file(tmp.path(), "unstated.ogg", &ogg[..last_page]);
    assert_eq!(decode_file(&unstated, HEAD).unwrap().stated_frames, None);
    let names = ["tone.mp3", "tone.ogg", "tone_aac.m4a", "tone_alac.m4a"];
    for path in names.iter().map(|n| dir.join(n)).chain([unstated]) {
        let name = path.file_name().unwrap().to_string_lossy();
        let whole = decode(&path).unwrap();
        for cut in [Cut::Head { max_seconds: 1.0 }, Cut::Crop { seconds: 1.0, offset: 0.5 }] {
            let d = decode_file(&path, cut).unwrap_or_else(|e| panic!("{name}: {e}"));
            // The header's count and the decoder's differ by codec padding (AAC's
            // priming: 15 ms), never more.
            let off = d.frames_in_file.abs_diff(whole.frames() as u64);
            assert!(
                off <= u64::from(whole.sample_rate) / 50,
                "{name} {cut:?}: {} frames in the file",
                d.frames_in_file
            );
            // A crop is placed by the length the header states, when it states one.
            let window = cut.window(whole.sample_rate, d.frames_in_file);
            let want = whole.slice(window.start as usize, (window.end - window.start) as usize);
            assert_eq!(d.audio.frames(), whole.sample_rate as usize, "{name} {cut:?}");
            assert!(d.audio == want, "{name} {cut:?}: not the frames of the whole file");
            assert_eq!(d.unterminated, d.stated_frames.is_none(), "{name}");
        }
    }
}

/// Cut short: a WAV whose data chunk states 3 s, an Ogg without its last pages.
/// What decodes is kept, and the shortfall is named.
#[test]
fn truncated_files_decode_what_is_there_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let full = wav_bytes(8000, SampleFormat::Int(16), &[sine(440.0, 0.5, 8000, 24_000)]);
    let wav = write_file(dir.path(), "cut.wav", &full[..full.len() / 2]);
    let d = decode_file(&wav, HEAD).unwrap();
    assert!((d.audio.duration_seconds() - 1.5).abs() < 0.01);
    let why = d.shortfall().expect("a shortfall");
    assert!(why.contains("3.0 s") && why.contains("1.5 s"), "{why}");
    let whole = write_file(dir.path(), "whole.wav", &full);
    assert_eq!(decode_file(&whole, HEAD).unwrap().shortfall(), None);

    let ogg = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/testdata/tone.ogg")).unwrap();
    let whole = write_file(dir.path(), "whole.ogg", &ogg);
    assert_eq!(decode_file(&whole, HEAD).unwrap().shortfall(), None);
    // Without its last page (symphonia refuses a file cut mid-page outright).
    let last_page = ogg.windows(4).rposition(|w| w == b"OggS").unwrap();
    let cut = write_file(dir.path(), "cut.ogg", &ogg[..last_page]);
    let d = decode_file(&cut, HEAD).unwrap_or_else(|e| panic!("cut.ogg: {e}"));
    assert!(d.audio.duration_seconds() < 1.2, "{} s", d.audio.duration_seconds());
    let why = d.shortfall().expect("a shortfall");
    assert!(why.contains("truncated") && why.contains("no end page"), "{why}");
}

#[test]
fn mono_is_duplicated_and_extra_channels_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mono =
        write_file(dir.path(), "mono.wav", &wav_bytes(8000, SampleFormat::Int(16), &[sine(440.0, 0.5, 8000, 8000)]));
    let a = decode(&mono).unwrap();
    assert_eq!((a.sample_rate, a.frames()), (8000, 8000));
    assert_eq!(a.left, a.right);

    let chans: Vec<Vec<f32>> = (0..6).map(|c| vec![c as f32 / 10.0; 1000]).collect();
    let six = write_file(dir.path(), "six.wav", &wav_bytes(192_000, SampleFormat::Int(24), &chans));
    let a = decode(&six).unwrap();
    assert_eq!(a.sample_rate, 192_000);
    assert!(a.left.iter().all(|&x| x.abs() < 1e-6));
    assert!(a.right.iter().all(|&x| (x - 0.1).abs() < 1e-6));
}

#[test]
fn cut_windows() {
    let head = |max_seconds| Cut::Head { max_seconds };
    assert_eq!(head(2.0).window(10, 100), 0..20);
    assert_eq!(head(20.0).window(10, 100), 0..100);
    assert_eq!(head(2.0).window(10, u64::MAX), 0..20);
    assert_eq!(head(f64::INFINITY).window(10, 100), 0..100);
    assert_eq!(Cut::Crop { seconds: 3.0, offset: 0.5 }.window(10, 100), 35..65);
    assert_eq!(Cut::Crop { seconds: 30.0, offset: 0.9 }.window(10, 100), 0..100);
}
