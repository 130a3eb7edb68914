//! The picture of a song the app shows beside its play button: the waveform's
//! envelope (the lowest and highest sample under each pixel column, both channels
//! together) over a time axis, drawn with the charts' fonts and colours.

use plotters::prelude::*;

use super::{chart_error, ensure_font, Theme, FONT};
use crate::codec::StereoAudio;
use crate::Result;

/// (lowest, highest) sample of each of `columns` equal slices of the song; an empty
/// song has no columns.
pub fn envelope(audio: &StereoAudio, columns: usize) -> Vec<(f32, f32)> {
    let frames = audio.frames();
    if frames == 0 || columns == 0 {
        return Vec::new();
    }
    (0..columns)
        .map(|c| {
            let (start, end) = (c * frames / columns, ((c + 1) * frames / columns).max(c * frames / columns + 1));
            let both = audio.left[start..end.min(frames)].iter().chain(&audio.right[start..end.min(frames)]);
            both.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &s| (lo.min(s), hi.max(s)))
        })
        .filter(|(lo, hi)| lo.is_finite() && hi.is_finite())
        .collect()
}

/// `audio` as an SVG document of `size` pixels: its envelope, and seconds along the bottom.
pub fn waveform_svg(audio: &StereoAudio, size: (u32, u32), theme: Theme) -> Result<String> {
    ensure_font()?;
    let palette = theme.palette();
    let seconds = audio.duration_seconds().max(1e-3);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&palette.background).map_err(chart_error)?;
        let peak = envelope(audio, 1).first().map_or(1.0, |(lo, hi)| lo.abs().max(hi.abs()).max(1.0)) as f64;
        let mut chart = ChartBuilder::on(&root)
            .margin(4)
            // Room for the last time label, centred on the right edge.
            .margin_right(16)
            .x_label_area_size(18)
            .build_cartesian_2d(0.0..seconds, -peak..peak)
            .map_err(chart_error)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_labels(6)
            .x_label_formatter(&|s: &f64| format!("{s:.1} s"))
            .label_style((FONT, 11).into_font().color(&palette.text))
            .axis_style(palette.grid)
            .light_line_style(palette.grid)
            .draw()
            .map_err(chart_error)?;
        let columns = chart.plotting_area().dim_in_pixel().0 as usize;
        let style = palette.series[1].stroke_width(1);
        let per_column = seconds / columns.max(1) as f64;
        let lines = envelope(audio, columns).into_iter().enumerate().map(|(i, (lo, hi))| {
            let x = (i as f64 + 0.5) * per_column;
            PathElement::new(vec![(x, lo as f64), (x, hi as f64)], style)
        });
        chart.draw_series(lines).map_err(chart_error)?;
        root.present().map_err(chart_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(seconds: f64, amplitude: f32) -> StereoAudio {
        let n = (48_000.0 * seconds) as usize;
        let left: Vec<f32> = (0..n).map(|i| amplitude * (i as f32 * 0.05).sin()).collect();
        StereoAudio { sample_rate: 48_000, right: left.iter().map(|s| -s * 0.5).collect(), left }
    }

    #[test]
    fn the_envelope_follows_the_samples_of_both_channels() {
        let mut audio = tone(1.0, 0.5);
        // A click in the right channel's last quarter only.
        audio.right[40_000] = 0.9;
        let env = envelope(&audio, 4);
        assert_eq!(env.len(), 4);
        for (lo, hi) in &env[..3] {
            assert!((*hi - 0.5).abs() < 0.01 && (*lo + 0.5).abs() < 0.01, "{lo} {hi}");
        }
        assert!((env[3].1 - 0.9).abs() < 1e-6, "the click shows: {:?}", env[3]);
        assert!(envelope(&StereoAudio::silence(48_000, 0), 10).is_empty());
        // More columns than frames: each column still has a frame.
        assert_eq!(envelope(&StereoAudio::silence(48_000, 3), 8).len(), 8);
    }

    #[test]
    fn the_picture_draws_a_line_per_column_and_the_time_axis() {
        let svg = waveform_svg(&tone(2.0, 0.8), (300, 80), Theme::Dark).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        assert!(svg.matches("<polyline").count() > 200, "one line per pixel column");
        let labels = svg.split('>').filter_map(|t| t.split('<').next()).map(str::trim);
        assert!(labels.filter(|t| t.ends_with(" s") && t.len() > 2).count() >= 2, "seconds along the bottom");
        let quiet = waveform_svg(&tone(2.0, 0.01), (300, 80), Theme::Light).unwrap();
        assert_ne!(svg, quiet, "the picture depends on the samples");
    }
}
