use super::*;
use crate::events::{Event, SampleLoss};

/// Ten steps an epoch, each of one sample at t in the middle of span `step % 8`.
fn step(step: u64, loss: f64) -> Event {
    Event::Step {
        step,
        epoch: (step - 1) / 10,
        loss,
        lr: 1e-4,
        grad_norm: 1.0,
        samples_per_sec: 3.0 + step as f64,
        memory_now_bytes: 100 << 20,
        memory_peak_bytes: (120 + step) << 20,
        elapsed_s: step as f64,
        eta_s: Some(10.0),
        samples: vec![SampleLoss { t: (step % 8) as f32 / 8.0 + 0.0625, loss: loss as f32 }],
    }
}

fn run(n: u64) -> Vec<Event> {
    let mut events = vec![Event::Paused { step: 0 }];
    events.extend((1..=n).map(|i| step(i, 1.0 / i as f64)));
    events
}

const SIZE: (u32, u32) = (640, 360);

/// The texts of an SVG (title, axis labels, legend).
fn texts(svg: &str) -> Vec<&str> {
    (svg.split("</text>")).filter_map(|t| t.rsplit_once('>').map(|(_, text)| text.trim())).collect()
}

#[test]
fn svg_contains_every_series() {
    let events = run(50);
    for (chart, names) in [
        (Chart::Loss, &["loss", "smoothed"][..]),
        (Chart::Throughput, &["samples/s"][..]),
        (Chart::Memory, &["now", "peak"][..]),
    ] {
        let svg = render_svg(chart, &RunState::replay(&events), SIZE, Theme::Light).unwrap().svg;
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // One polyline per series carries all 50 points (others are the mesh and legend).
        let data_lines = (svg.split("<polyline").skip(1))
            .filter(|el| el.split("/>").next().unwrap().matches(',').count() == 50)
            .count();
        assert_eq!(data_lines, names.len(), "{chart:?}");
        let texts = texts(&svg);
        for name in names {
            assert!(texts.contains(name), "{chart:?}: {name} in {texts:?}");
        }
    }
}

#[test]
fn empty_and_single_point_inputs_render() {
    for events in [vec![], run(1)] {
        for chart in [Chart::Loss, Chart::Throughput, Chart::Memory, Chart::NoiseLevel] {
            let svg = render_svg(chart, &RunState::replay(&events), SIZE, Theme::Dark).unwrap().svg;
            assert!(svg.contains("</svg>"));
        }
    }
}

#[test]
fn redone_steps_replace_earlier_ones() {
    // Crash after step 5, resume from the checkpoint at step 3.
    let mut events = run(5);
    events.extend([step(4, 0.7), step(5, 0.6), step(6, 0.5)]);
    let loss = &series(Chart::Loss, &RunState::replay(&events))[0].points;
    let steps: Vec<u64> = loss.iter().map(|p| p.0).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
    assert_eq!(loss[3].1, 0.7);
}

#[test]
fn the_loss_chart_shows_the_validation_curve_and_redone_values_are_replaced() {
    let mut events = run(50);
    for (step, loss) in [(10, 0.5), (20, 0.4), (30, 0.35), (20, 0.45), (30, 0.3), (40, 0.25)] {
        events.push(Event::Validation { step, loss, best: true });
    }
    let v = validation_series(&RunState::replay(&events)).unwrap();
    assert_eq!(v.points, [(10, 0.5), (20, 0.45), (30, 0.3), (40, 0.25)]);
    let svg = render_svg(Chart::Loss, &RunState::replay(&events), SIZE, Theme::Light).unwrap().svg;
    let texts = texts(&svg);
    assert!(texts.contains(&"validation"), "the legend names it: {texts:?}");
    assert!(validation_series(&RunState::replay(&run(5))).is_none());
    let memory = render_svg(Chart::Memory, &RunState::replay(&events), SIZE, Theme::Light).unwrap().svg;
    assert!(!memory.contains("validation"), "only the loss chart shows it");
}

#[test]
fn the_noise_level_chart_compares_the_first_epoch_with_the_latest() {
    // Five epochs of ten steps; each epoch has samples in all eight spans.
    let events = run(50);
    let figure = noise_level_figure(&RunState::replay(&events), &Theme::Light.palette());
    let names: Vec<&str> = figure.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["epoch 1", "epoch 5"]);
    // Epoch 1's span 0 holds step 8 alone (loss 1/8); epoch 5's holds step 48.
    assert_eq!(figure.lines[0].points[0], (0.0625, 0.125));
    assert_eq!(figure.lines[1].points[0], (0.0625, (1.0f32 / 48.0) as f64));
    let svg = render_svg(Chart::NoiseLevel, &RunState::replay(&events), SIZE, Theme::Light).unwrap().svg;
    let data_lines =
        (svg.split("<polyline").skip(1)).filter(|el| el.split("/>").next().unwrap().matches(',').count() == 8).count();
    assert_eq!(data_lines, 2, "one line of 8 buckets per epoch");
    let texts = texts(&svg);
    for text in ["Loss by noise level", "epoch 1", "epoch 5"] {
        assert!(texts.contains(&text), "{text} in {texts:?}");
    }
    // A run in its first epoch has one line; a log without samples none.
    assert_eq!(noise_level_figure(&RunState::replay(&run(5)), &Theme::Dark.palette()).lines.len(), 1);
    let old: Vec<Event> = run(5)
        .into_iter()
        .map(|mut e| {
            if let Event::Step { samples, .. } = &mut e {
                samples.clear();
            }
            e
        })
        .collect();
    assert!(noise_level_figure(&RunState::replay(&old), &Theme::Dark.palette()).lines.is_empty());
}

/// The readout places the drawn points in the drawing: a value read under the
/// pointer at the plotting area's edges is the first and the last step's.
#[test]
fn the_readout_tells_where_the_drawn_points_lie() {
    let events = run(50);
    let drawn = render_svg(Chart::Loss, &RunState::replay(&events), SIZE, Theme::Light).unwrap();
    let r = &drawn.readout;
    assert_eq!(r.size, SIZE);
    let (left, top, right, bottom) = r.area;
    assert!(0 < left && left < right && right <= SIZE.0 as i32, "{:?}", r.area);
    assert!(0 < top && top < bottom && bottom <= SIZE.1 as i32, "{:?}", r.area);
    assert_eq!((r.x_range, r.x_desc.as_str(), r.y_desc.as_str()), ((1.0, 50.0), "step", "loss"));
    assert!(r.y_range.0 < 1.0 / 50.0 && r.y_range.1 > 1.0, "{:?}", r.y_range);
    let names: Vec<&str> = r.lines.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["loss", "smoothed"]);
    assert_eq!(r.lines[0].points.len(), 50);
    assert_eq!((r.lines[0].points[0], r.lines[0].points[49]), ((1.0, 1.0), (50.0, 1.0 / 50.0)));
    // The SVG's first data point (step 1, loss 1) lies where the readout maps it.
    let x = left as f64 + (1.0 - r.x_range.0) / (r.x_range.1 - r.x_range.0) * (right - left) as f64;
    let y = bottom as f64 - (1.0 - r.y_range.0) / (r.y_range.1 - r.y_range.0) * (bottom - top) as f64;
    let line = (drawn.svg.split("<polyline").skip(1))
        .find(|el| el.split("/>").next().unwrap().matches(',').count() == 50)
        .unwrap();
    let first = line.split("points=\"").nth(1).unwrap().split_whitespace().next().unwrap();
    let (px, py) = first.split_once(',').unwrap();
    let (px, py): (f64, f64) = (px.parse().unwrap(), py.parse().unwrap());
    assert!((px - x).abs() <= 1.5 && (py - y).abs() <= 1.5, "drawn at ({px}, {py}), mapped to ({x}, {y})");
    let noise = render_svg(Chart::NoiseLevel, &RunState::replay(&events), SIZE, Theme::Dark).unwrap().readout;
    assert_eq!(noise.lines.len(), 2, "epoch 1 and the latest");
}

#[test]
fn long_runs_are_thinned() {
    let points: Vec<_> = (0..10_000).map(|i| (i, 0.0)).collect();
    let thinned = thin(&points);
    assert!(thinned.len() <= MAX_POINTS + 1);
    assert_eq!(thinned.last(), points.last());
    assert_eq!(thin(&points[..3]), points[..3]);
}

#[test]
fn png_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.png");
    render_png(Chart::Loss, &RunState::replay(&run(20)), SIZE, Theme::Light, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}
