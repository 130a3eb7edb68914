//! Preparation as a run meets it: bad files reported and skipped, the source folder
//! never touched, clear errors, cuts and crops, pipes and broken headers, bounded
//! memory, cancels and progress.

use super::*;
use crate::codec::condition::HashConditioner;
use crate::codec::encode::MelEncoder;
use crate::codec::StereoAudio;
use crate::data::testutil::{
    aiff_bytes, flac_bytes, good_wav, issue_for, mkfifo, models, noise_bytes, prepare, sine, stereo_sine, use_of,
    warning_for, write_file,
};
use crate::data::wav::{wav_bytes, SampleFormat};
use crate::data::{TagMode, TriggerTag};
use candle_core::Tensor;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

/// Every file under `dir` with its size and mtime.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.insert(p, (m.len(), m.modified().unwrap(), m.permissions().mode()));
        }
    }
    out
}

/// Root reads files whatever their permission bits say: find out honestly.
fn permissions_bind(path: &Path) -> bool {
    std::fs::File::open(path).is_err()
}

#[test]
fn bad_files_are_reported_and_good_ones_used() {
    let src = tempfile::tempdir().unwrap();
    let d = src.path();
    // Usable, in every shape the issue lists.
    good_wav(d, "good.wav", 2.0, 440.0);
    write_file(d, "mono_8k.wav", &wav_bytes(8000, SampleFormat::Int(16), &[sine(300.0, 0.5, 8000, 12_000)]));
    let six: Vec<Vec<f32>> = (0..6).map(|c| sine(200.0 + 100.0 * c as f64, 0.4, 192_000, 230_400)).collect();
    write_file(d, "six_192k.wav", &wav_bytes(192_000, SampleFormat::Int(16), &six));
    write_file(d, "int24.wav", &wav_bytes(48_000, SampleFormat::Int(24), &stereo_sine(48_000, 1.5, 500.0)));
    write_file(d, "float64.wav", &wav_bytes(32_000, SampleFormat::Float(64), &stereo_sine(32_000, 1.5, 500.0)));
    write_file(d, "lossless.flac", &flac_bytes(44_100, &stereo_sine(44_100, 1.5, 600.0)));
    write_file(d, "apple.aiff", &aiff_bytes(22_050, &stereo_sine(22_050, 1.5, 700.0)));
    good_wav(d, OsStr::from_bytes(b"caf\xe9 latin1.wav"), 1.5, 800.0);
    // Bad.
    let mut corrupt = wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 1.5, 440.0));
    corrupt[20..36].copy_from_slice(&noise_bytes(16, 7)); // the fmt chunk
    write_file(d, "corrupt.wav", &corrupt);
    let mut corrupt_flac = flac_bytes(44_100, &stereo_sine(44_100, 3.0, 440.0));
    let n = corrupt_flac.len();
    corrupt_flac[n / 4..n * 3 / 4].copy_from_slice(&noise_bytes(n * 3 / 4 - n / 4, 9));
    write_file(d, "corrupt.flac", &corrupt_flac);
    let full = wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 3.0, 440.0));
    write_file(d, "truncated.wav", &full[..full.len() * 2 / 5]);
    write_file(d, "empty.wav", b"");
    write_file(d, "text.wav", b"these are my lyrics, not audio\n");
    write_file(d, "random.mp3", &noise_bytes(64 << 10, 3));
    write_file(d, "silence.wav", &wav_bytes(44_100, SampleFormat::Int(16), &[vec![0.0; 88_200], vec![0.0; 88_200]]));
    write_file(d, "short.wav", &wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 0.3, 440.0)));
    write_file(d, "notes.pdf", b"%PDF-1.4");
    let locked = good_wav(d, "locked.wav", 1.5, 440.0);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let locked_binds = permissions_bind(&locked);
    if !locked_binds {
        eprintln!("note: running as root, so a mode-000 file is still readable; its assertion is skipped");
    }

    let before = snapshot(d);
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = LatentCache::new(cache_dir.path()).unwrap();
    let spec = DataSpec::new(d);
    for cache in [None, Some(&cache)] {
        let (data, events) = prepare(&spec, cache);
        let data = data.unwrap();
        let used: Vec<Vec<u8>> = data.items.iter().map(|i| i.source.file_name().unwrap().as_bytes().to_vec()).collect();
        let mut want: Vec<&[u8]> = vec![
            b"apple.aiff",
            b"caf\xe9 latin1.wav",
            b"float64.wav",
            b"good.wav",
            b"int24.wav",
            b"lossless.flac",
            b"mono_8k.wav",
            b"six_192k.wav",
            b"truncated.wav",
        ];
        if !locked_binds {
            want.insert(5, b"locked.wav");
        }
        assert_eq!(used, want, "cache {}", cache.is_some());

        for (name, why) in [
            (&b"corrupt.wav"[..], "not a readable audio file"),
            (b"corrupt.flac", "corrupt"),
            (b"empty.wav", "empty file"),
            (b"text.wav", "not a readable audio file"),
            (b"random.mp3", "not a readable audio file"),
            (b"silence.wav", "silent"),
            (b"short.wav", "too short"),
            (b"notes.pdf", "unsupported file type .pdf"),
        ] {
            let reason =
                issue_for(&events, name).unwrap_or_else(|| panic!("no issue for {}", String::from_utf8_lossy(name)));
            assert!(reason.contains(why), "{}: {reason}", String::from_utf8_lossy(name));
        }
        if locked_binds {
            assert!(issue_for(&events, b"locked.wav").is_some_and(|r| r.contains("ermission")));
        }
        // Cut short (the header states 3 s): used with what decodes, and said so.
        let warning = warning_for(&events, b"truncated.wav").expect("a warning for truncated.wav");
        assert!(
            warning.contains("truncated") && warning.contains("3.0 s") && warning.contains("the song is used"),
            "{warning}"
        );
        let truncated = use_of(&events, "truncated.wav").unwrap();
        assert!((truncated.seconds_in_file - 1.2).abs() < 0.01, "{truncated:?}");
        assert_eq!(data.issues.len(), events.iter().filter(|e| matches!(e, DataEvent::Issue(_))).count());
        assert!(events.contains(&DataEvent::Progress {
            stage: Stage::Encoding,
            done: 17,
            total: 17,
            file: None,
            seconds: None,
        }));

        let (enc, cond) = models();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        for i in 0..data.len() {
            let s = data.sample(i, &enc, &cond, &mut rng).unwrap();
            let t = s.target_latents.dim(0).unwrap();
            let seconds = data.items[i].meta.duration_seconds;
            assert_eq!(t, (seconds * 25.0).floor() as usize, "{}", s.source.display());
            assert_eq!(s.target_latents.dims(), [t, 64]);
            assert_eq!(s.attention_mask.dims(), [t]);
            assert_eq!(s.context_latents.dims(), [t, 128]);
            assert_eq!(s.encoder_hidden_states.dims(), [16 + 1 + 32, 16]);
            assert_eq!(s.encoder_attention_mask.dims(), [49]);
        }
    }
    assert_eq!(snapshot(d), before, "the source folder changed");
}

#[test]
fn empty_folder_is_a_clear_error() {
    let src = tempfile::tempdir().unwrap();
    let (r, _) = prepare(&DataSpec::new(src.path()), None);
    let e = r.unwrap_err();
    assert!(matches!(e, Error::NoUsableAudio { .. }));
    let msg = e.to_string();
    assert!(msg.contains(&src.path().display().to_string()) && msg.contains("no audio files"), "{msg}");
}

#[test]
fn folder_of_only_bad_files_is_a_clear_error() {
    let src = tempfile::tempdir().unwrap();
    write_file(src.path(), "a.wav", b"not audio");
    write_file(src.path(), "b.mp3", &noise_bytes(4096, 1));
    write_file(src.path(), "cover.png", b"png");
    let (r, events) = prepare(&DataSpec::new(src.path()), None);
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains(&src.path().display().to_string()) && msg.contains("none of 2 audio file(s)"), "{msg}");
    assert_eq!(events.iter().filter(|e| matches!(e, DataEvent::Issue(_))).count(), 3);
}

#[test]
fn nonsense_settings_are_an_error() {
    let src = tempfile::tempdir().unwrap();
    good_wav(src.path(), "a.wav", 2.0, 440.0);
    for spec in [
        DataSpec { max_duration_seconds: 0.0, ..DataSpec::new(src.path()) },
        DataSpec { crop_seconds: Some(0.2), ..DataSpec::new(src.path()) },
        DataSpec { crop_seconds: Some(f64::NAN), ..DataSpec::new(src.path()) },
    ] {
        assert!(matches!(prepare(&spec, None).0, Err(Error::BadDataSpec(_))), "{spec:?}");
    }
}

#[test]
fn missing_folder_is_an_error_naming_it() {
    let (r, _) = prepare(&DataSpec::new("/no/such/songs"), None);
    assert!(r.unwrap_err().to_string().contains("/no/such/songs"));
}

#[test]
fn max_duration_and_trigger_tag() {
    let src = tempfile::tempdir().unwrap();
    good_wav(src.path(), "a.wav", 3.0, 440.0);
    std::fs::write(src.path().join("a.caption.txt"), "soft piano").unwrap();
    let spec = DataSpec {
        max_duration_seconds: 1.5,
        trigger: Some(TriggerTag { tag: "mystyle".into(), mode: TagMode::Prepend }),
        ..DataSpec::new(src.path())
    };
    let (data, events) = prepare(&spec, None);
    let data = data.unwrap();
    let item = &data.items[0];
    assert_eq!(item.meta.caption, "mystyle, soft piano");
    assert_eq!(item.seconds_used, 1.5);
    let note = use_of(&events, "a.wav").and_then(|u| u.note.as_deref());
    assert!(note.is_some_and(|n| n.starts_with("cut to 1.5 s")), "{note:?}");
    assert!((item.meta.duration_seconds - 3.0).abs() < 1e-9, "metas keep the file's duration");
    let (enc, cond) = models();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    assert_eq!(data.sample(0, &enc, &cond, &mut rng).unwrap().target_latents.dim(0).unwrap(), 37);
}

#[test]
fn long_songs_are_reported_cut_and_the_summary_counts_seconds_used() {
    let src = tempfile::tempdir().unwrap();
    // 250 s at 8 kHz mono: cheap to write and to decode.
    let long = sine(220.0, 0.5, 8000, 250 * 8000);
    write_file(src.path(), "long.wav", &wav_bytes(8000, SampleFormat::Int(16), &[long]));
    good_wav(src.path(), "short.wav", 2.0, 440.0);

    let (data, events) = prepare(&DataSpec::new(src.path()), None);
    let data = data.unwrap();
    let long = use_of(&events, "long.wav").unwrap();
    assert_eq!((long.seconds_used, long.seconds_in_file), (240.0, 250.0));
    assert!(long.note.as_deref().is_some_and(|n| n.contains("cut to 240 s")), "{long:?}");
    assert_eq!(use_of(&events, "short.wav").unwrap().note, None);
    assert_eq!(data.seconds_used(), 242.0);
    assert_eq!(data.seconds_in_files(), 252.0);

    // With crops, the crop is what is used.
    let cropped = DataSpec { crop_seconds: Some(30.0), ..DataSpec::new(src.path()) };
    let (data, events) = prepare(&cropped, None);
    let long = use_of(&events, "long.wav").unwrap();
    assert_eq!(long.seconds_used, 30.0);
    assert!(long.note.as_deref().is_some_and(|n| n.contains("random 30 s crop")), "{long:?}");
    assert_eq!(data.unwrap().seconds_used(), 32.0);
}

#[test]
fn a_bad_sidecar_value_is_a_warning_and_the_song_is_used() {
    let src = tempfile::tempdir().unwrap();
    good_wav(src.path(), "introzik.wav", 2.0, 440.0);
    std::fs::write(src.path().join("introzik.json"), r#"{"bpm": "fast", "caption": "slow intro"}"#).unwrap();
    let (data, events) = prepare(&DataSpec::new(src.path()), None);
    let data = data.unwrap();
    assert_eq!(
        warning_for(&events, b"introzik.json"),
        Some(r#"field "bpm" = "fast" is not a number: ignored; the song is used"#)
    );
    assert_eq!(issue_for(&events, b"introzik.json"), None);
    assert_eq!((data.len(), data.skipped()), (1, 0));
    let meta = &data.items[0].meta;
    assert_eq!((meta.caption.as_str(), meta.bpm), ("slow intro", None));
}

/// A folder holding a named pipe called like a song, and one called like another
/// song's caption: preparation neither waits on them nor reads them.
#[test]
fn named_pipes_are_reported_not_waited_on() {
    let src = tempfile::tempdir().unwrap();
    let d = src.path();
    mkfifo(&d.join("y.wav"));
    good_wav(d, "s.wav", 1.5, 440.0);
    mkfifo(&d.join("s.caption.txt"));
    let (data, events) = prepare(&DataSpec::new(d), None);
    assert_eq!(data.unwrap().len(), 1);
    let skipped = issue_for(&events, b"y.wav").expect("y.wav skipped");
    assert!(skipped.contains("named pipe (FIFO), not a regular file"), "{skipped}");
    let warning = warning_for(&events, b"s.caption.txt").expect("a warning for the caption pipe");
    assert!(warning.contains("named pipe") && warning.contains("the song is used"), "{warning}");
}

/// A header stating 0 Hz (symphonia panics on it), 1 Hz, or 1 MHz: that file is
/// skipped with a reason; the run goes on with the rest.
#[test]
fn an_impossible_sample_rate_skips_the_file_not_the_run() {
    let src = tempfile::tempdir().unwrap();
    let d = src.path();
    good_wav(d, "good.wav", 1.5, 440.0);
    let tone = [sine(440.0, 0.5, 8000, 8000)];
    for (name, rate) in [("zero.wav", 0), ("one.wav", 1), ("mega.wav", 1_000_000)] {
        let mut bytes = wav_bytes(8000, SampleFormat::Int(16), &tone);
        bytes[24..28].copy_from_slice(&u32::to_le_bytes(rate));
        write_file(d, name, &bytes);
    }
    let (data, events) = prepare(&DataSpec::new(d), None);
    assert_eq!(data.unwrap().len(), 1);
    // symphonia's WAV reader panics on 0 Hz before any rate is seen: its message.
    let zero = issue_for(&events, b"zero.wav").expect("zero.wav skipped");
    assert_eq!(zero, "the decoder failed on this file (TimeBase cannot have 0 numerator or denominator)");
    for (name, rate) in [(&b"one.wav"[..], "1 Hz"), (b"mega.wav", "1000000 Hz")] {
        let why = issue_for(&events, name).unwrap_or_else(|| panic!("{} used", String::from_utf8_lossy(name)));
        assert!(why.starts_with(&format!("sample rate {rate} is not one audio uses")), "{why}");
    }
}

/// Where `a_long_file_fits_in_memory_meant_for_the_cut` puts its folder for the child.
const LONG_FOLDER: &str = "OSTINATO_TEST_LONG_FOLDER";
/// Memory the child may allocate beyond what it holds when it starts: far more
/// than 240 s at 8 kHz (15 MB decoded), far less than an hour (230 MB).
const CHILD_BUDGET: u64 = 96 << 20;

/// An hour of audio (8 kHz 8-bit mono: 29 MB on disk, 230 MB decoded) prepared
/// by a child process whose data memory is capped at `CHILD_BUDGET`: decoding
/// stops at the 240 s cut, and the song is still named with its hour.
#[test]
fn a_long_file_fits_in_memory_meant_for_the_cut() {
    let src = tempfile::tempdir().unwrap();
    let mut file = std::io::BufWriter::new(std::fs::File::create(src.path().join("hour.wav")).unwrap());
    let second = wav_bytes(8000, SampleFormat::Int(8), &[sine(220.0, 0.5, 8000, 8000)]);
    let data_at = second.windows(4).position(|w| w == b"data").unwrap() + 8;
    let data_len = (second.len() - data_at) as u32 * 3600;
    let mut header = second[..data_at].to_vec();
    header[4..8].copy_from_slice(&(data_at as u32 - 8 + data_len).to_le_bytes());
    header[data_at - 4..].copy_from_slice(&data_len.to_le_bytes());
    file.write_all(&header).unwrap();
    for _ in 0..3600 {
        file.write_all(&second[data_at..]).unwrap();
    }
    file.into_inner().unwrap().sync_all().unwrap();

    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "data::prepare::tests::long_file_child", "--ignored", "--nocapture"])
        .env(LONG_FOLDER, src.path())
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.contains("1 passed"), "{:?}\n{said}", out.status);
}

/// The child of `a_long_file_fits_in_memory_meant_for_the_cut`.
#[test]
#[ignore = "run by a_long_file_fits_in_memory_meant_for_the_cut, under a memory limit"]
fn long_file_child() {
    let folder = std::env::var_os(LONG_FOLDER).expect("the folder of the parent test");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmData:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let limit = kib * 1024 + CHILD_BUDGET;
    let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_DATA, &rlimit) }, 0);
    let (data, events) = prepare(&DataSpec::new(folder), None);
    assert_eq!(data.unwrap().seconds_used(), 240.0);
    let hour = use_of(&events, "hour.wav").unwrap();
    assert_eq!((hour.seconds_used, hour.seconds_in_file), (240.0, 3600.0));
    assert!(hour.note.as_deref().is_some_and(|n| n.contains("cut to 240 s")), "{hour:?}");
}

/// The demo encoder, counting its calls.
struct Counting {
    inner: MelEncoder,
    calls: AtomicUsize,
}

impl LatentEncoder for Counting {
    fn id(&self) -> String {
        self.inner.id()
    }
    fn sample_rate(&self) -> u32 {
        self.inner.sample_rate()
    }
    fn frames_per_second(&self) -> f64 {
        self.inner.frames_per_second()
    }
    fn latent_channels(&self) -> usize {
        self.inner.latent_channels()
    }
    fn encode_cancellable(
        &self,
        audio: &StereoAudio,
        cancel: &Cancel,
        progress: &mut dyn FnMut(f64, f64),
    ) -> Result<Tensor> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.encode_cancellable(audio, cancel, progress)
    }
}

#[test]
fn a_cancel_stops_preparation_before_the_next_file_or_chunk() {
    let src = tempfile::tempdir().unwrap();
    for i in 0..5 {
        good_wav(src.path(), format!("{i}.wav"), 2.0, 400.0 + 50.0 * i as f64);
    }
    let enc = Counting { inner: MelEncoder::new(), calls: AtomicUsize::new(0) };
    let cond = HashConditioner::for_encoder(16, &enc.inner).unwrap().with_max_tokens(32, 16);
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = LatentCache::new(cache_dir.path()).unwrap();
    let cancel = Cancel::default();
    let mut used = 0;
    let r = prepare_dataset(&DataSpec::new(src.path()), &enc, &cond, Some(&cache), &cancel, &mut |e| {
        match e {
            // The stop arrives while the second song is being prepared.
            DataEvent::Progress { done: 1, file: Some(_), .. } => cancel.cancel(),
            DataEvent::Used(_) => used += 1,
            _ => {}
        }
    });
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert_eq!(used, 1, "only the first song is prepared");
    // The second song's encoding gave up at its first chunk; no third began.
    assert_eq!(enc.calls.load(Ordering::SeqCst), 2);
}

#[test]
fn encoding_reports_seconds_of_the_current_file() {
    let src = tempfile::tempdir().unwrap();
    good_wav(src.path(), "a.wav", 1.0, 300.0);
    good_wav(src.path(), "b.wav", 3.0, 500.0);
    let (enc, cond) = models();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = LatentCache::new(cache_dir.path()).unwrap();
    let mut tiles = Vec::new();
    prepare_dataset(&DataSpec::new(src.path()), &enc, &cond, Some(&cache), &Cancel::never(), &mut |e| {
        if let DataEvent::Progress { done, file: Some(f), seconds: Some(s), .. } = e {
            tiles.push((done, f.file_name().unwrap().to_string_lossy().into_owned(), s));
        }
    })
    .unwrap();
    // Each file's tiles count up to its own length, with the files done before it.
    let of = |name: &str| tiles.iter().filter(|t| t.1 == name).map(|t| (t.0, t.2)).collect::<Vec<_>>();
    let (a, b) = (of("a.wav"), of("b.wav"));
    assert!(a.len() >= 2 && b.len() >= 2, "{tiles:?}");
    assert!(a.iter().all(|&(done, _)| done == 0) && b.iter().all(|&(done, _)| done == 1));
    for file in [&a, &b] {
        assert!(file.windows(2).all(|w| w[0].1 .0 <= w[1].1 .0), "seconds never go back: {file:?}");
        let (last_done, last_total) = file.last().unwrap().1;
        assert_eq!(last_done, last_total);
    }
    assert!((b.last().unwrap().1 .1 - 3.0).abs() < 0.05, "{b:?}");
}

#[test]
fn the_demo_folder_prepares_every_clip_with_its_labels() {
    let (enc, cond) = models();
    let spec = DataSpec::new(crate::data::synth::demo_dir());
    let t = std::time::Instant::now();
    let data = prepare_dataset(&spec, &enc, &cond, None, &Cancel::never(), &mut |_| {}).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    for i in 0..data.len() {
        data.sample(i, &enc, &cond, &mut rng).unwrap();
    }
    assert_eq!(data.len(), 6);
    assert!(data.issues.is_empty(), "{:?}", data.issues);
    assert!(data.items.iter().all(|i| i.meta.bpm.is_some() && !i.meta.caption.is_empty()));
    // Its speed is the benches' to measure (these machines are shared): only printed here.
    println!("the demo folder prepared and sampled in {:?}", t.elapsed());
}
