//! Charts of a run's metrics, drawn from its [`RunState`]: SVG strings for the app (with
//! a [`Readout`] of what they show, for a value under the pointer), PNG files for
//! reports. The same drawing code serves both backends.
//!
//! Text is measured (and, in PNGs, drawn) with DejaVu Sans embedded in the binary,
//! so no system fonts are needed. SVGs name the font family `sans-serif`; the viewer
//! draws it with its own sans-serif font.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use serde::{Deserialize, Serialize};

pub mod waveform;
pub use waveform::waveform_svg;

use crate::events::read_events;
use crate::metrics::LossSmoother;
use crate::noise_levels::loss_by_noise_level_of;
use crate::run_state::{RunState, StepRecord};
use crate::{Error, Result};

/// Which metric a chart shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    /// Loss per step, raw and smoothed.
    Loss,
    /// Samples per second.
    Throughput,
    /// Memory in use now and at peak, in MiB.
    Memory,
    /// Mean loss per timestep bucket, first epoch against the latest (`noise_levels`).
    NoiseLevel,
}

impl Chart {
    /// Every chart, in the order the app and reports show them.
    pub const ALL: [Chart; 4] = [Chart::Loss, Chart::NoiseLevel, Chart::Throughput, Chart::Memory];

    fn title_and_unit(self) -> (&'static str, &'static str) {
        match self {
            Chart::Loss => ("Loss", "loss"),
            Chart::Throughput => ("Throughput", "samples/s"),
            Chart::Memory => ("Memory", "MiB"),
            Chart::NoiseLevel => ("Loss by noise level", "mean loss"),
        }
    }

    /// The file name a report gives it (without extension).
    pub fn file_stem(self) -> &'static str {
        match self {
            Chart::Loss => "loss",
            Chart::Throughput => "throughput",
            Chart::Memory => "memory",
            Chart::NoiseLevel => "noise-levels",
        }
    }
}

/// Colours to match the app's light or dark appearance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Theme {
    Light,
    Dark,
}

struct Palette {
    background: RGBColor,
    text: RGBColor,
    grid: RGBColor,
    series: [RGBColor; 2],
    /// The validation loss, apart from the training loss's blues.
    validation: RGBColor,
}

impl Theme {
    fn palette(self) -> Palette {
        match self {
            Theme::Light => Palette {
                background: RGBColor(255, 255, 255),
                text: RGBColor(40, 40, 40),
                grid: RGBColor(225, 225, 225),
                series: [RGBColor(130, 170, 225), RGBColor(20, 90, 200)],
                validation: RGBColor(225, 110, 20),
            },
            Theme::Dark => Palette {
                background: RGBColor(30, 30, 32),
                text: RGBColor(220, 220, 220),
                grid: RGBColor(60, 60, 64),
                series: [RGBColor(90, 125, 180), RGBColor(110, 170, 255)],
                validation: RGBColor(255, 160, 70),
            },
        }
    }
}

/// Smoothing weight of the "smoothed" loss line.
const LOSS_SMOOTHING: f64 = 0.9;
/// Most points drawn per line: longer runs are thinned, keeping the last point.
const MAX_POINTS: usize = 1500;
const FONT: &str = "sans-serif";

/// One named line of a chart, as (step, value) points.
struct Series {
    name: &'static str,
    points: Vec<(u64, f64)>,
}

/// The validation losses of a run; `None` when it held no clips out.
fn validation_series(state: &RunState) -> Option<Series> {
    let points = state.validations().to_vec();
    (!points.is_empty()).then_some(Series { name: "validation", points })
}

fn series(chart: Chart, state: &RunState) -> Vec<Series> {
    const MIB: f64 = 1024.0 * 1024.0;
    let line = |name, value: fn(&StepRecord) -> f64| Series {
        name,
        points: state.series().iter().map(|p| (p.step, value(p))).collect(),
    };
    match chart {
        Chart::Loss => {
            let raw = line("loss", |p| p.loss);
            let mut smoother = LossSmoother::new(LOSS_SMOOTHING);
            let smoothed =
                Series { name: "smoothed", points: raw.points.iter().map(|&(x, y)| (x, smoother.push(y))).collect() };
            vec![raw, smoothed]
        }
        Chart::Throughput => vec![line("samples/s", |p| p.samples_per_sec)],
        Chart::Memory => {
            vec![line("now", |p| p.memory_now_bytes as f64 / MIB), line("peak", |p| p.memory_peak_bytes as f64 / MIB)]
        }
        // Not a chart over steps: `noise_level_figure` draws it.
        Chart::NoiseLevel => Vec::new(),
    }
}

/// Every n-th point so that at most `MAX_POINTS` remain, plus the last.
fn thin<X: Copy + PartialEq>(points: &[(X, f64)]) -> Vec<(X, f64)> {
    let stride = points.len().div_ceil(MAX_POINTS).max(1);
    let mut out: Vec<_> = points.iter().copied().step_by(stride).collect();
    if let (Some(&last), Some(&kept)) = (points.last(), out.last()) {
        if last != kept {
            out.push(last);
        }
    }
    out
}

/// The steps to show: the first to the last, widened around a single point.
fn step_range(steps: impl Iterator<Item = u64>) -> std::ops::Range<u64> {
    let (lo, hi) = steps.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    match (lo, hi) {
        (u64::MAX, _) => 0..2,
        (lo, hi) if lo == hi => lo.saturating_sub(1)..lo + 1,
        (lo, hi) => lo..hi,
    }
}

/// A range that shows `values` with a 5% margin; a sensible default when there is
/// nothing (or only one value) to show.
fn value_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 0.0..1.0;
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { lo.abs().max(1.0) * 0.1 };
    (lo - pad)..(hi + pad)
}

fn chart_error(e: impl std::fmt::Display) -> Error {
    Error::Chart(e.to_string())
}

fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    ok.then_some(()).ok_or_else(|| Error::Chart("the embedded font could not be loaded".into()))
}

/// One line of a figure, with its look.
struct Line<X> {
    name: String,
    points: Vec<(X, f64)>,
    style: ShapeStyle,
    /// Marker radius; 0 for none.
    marker: u32,
}

/// What a chart draws and how it is framed; x is a step or a timestep.
struct Figure<X> {
    title: &'static str,
    x_desc: &'static str,
    y_desc: &'static str,
    x_range: Range<X>,
    lines: Vec<Line<X>>,
    legend: SeriesLabelPosition,
}

/// Line styles for `count` lines: the last is the main one (smoothed loss, peak memory,
/// the latest epoch), drawn last, thicker, in the stronger colour.
fn styles(palette: &Palette, count: usize) -> impl Iterator<Item = ShapeStyle> + '_ {
    let colours = &palette.series[palette.series.len() - count.min(palette.series.len())..];
    colours.iter().enumerate().map(move |(i, colour)| colour.stroke_width(if i + 1 == colours.len() { 2 } else { 1 }))
}

/// A chart over steps; validation, sparse, is marked on top of the loss.
fn step_figure(chart: Chart, state: &RunState, palette: &Palette) -> Figure<u64> {
    let plain = series(chart, state);
    let count = plain.len();
    let mut lines: Vec<Line<u64>> = (plain.into_iter().zip(styles(palette, count)))
        // A line needs two points: mark a lone first one so it shows.
        .map(|(s, style)| Line {
            name: s.name.into(),
            marker: if s.points.len() == 1 { 3 } else { 0 },
            points: s.points,
            style,
        })
        .collect();
    if let Some(v) = validation_series(state).filter(|_| chart == Chart::Loss) {
        lines.push(Line {
            name: v.name.into(),
            points: v.points,
            style: palette.validation.stroke_width(2),
            marker: 3,
        });
    }
    let (title, y_desc) = chart.title_and_unit();
    Figure {
        title,
        x_desc: "step",
        y_desc,
        x_range: step_range(lines.iter().flat_map(|l| l.points.iter().map(|p| p.0))),
        lines,
        // Away from where the lines usually run: loss falls, memory climbs.
        legend: if chart == Chart::Memory { SeriesLabelPosition::LowerRight } else { SeriesLabelPosition::UpperRight },
    }
}

/// The mean loss per noise level, first epoch against the latest.
fn noise_level_figure(state: &RunState, palette: &Palette) -> Figure<f64> {
    let by_level = loss_by_noise_level_of(state);
    let lines = (by_level.epochs.iter().zip(styles(palette, by_level.epochs.len())))
        .map(|(e, style)| Line {
            name: format!("epoch {}", e.epoch + 1),
            points: by_level.levels.iter().zip(&e.means).filter_map(|(&t, m)| m.map(|m| (t, m))).collect(),
            style,
            marker: 3,
        })
        .collect();
    let (title, y_desc) = Chart::NoiseLevel.title_and_unit();
    Figure {
        title,
        x_desc: if by_level.fixed { "timestep t (the run's levels; 1 = noise)" } else { "timestep t (1 = noise)" },
        y_desc,
        // Room for the markers at t = 1 and near 0.
        x_range: -0.03..1.03,
        lines,
        legend: SeriesLabelPosition::UpperRight,
    }
}

/// What a viewer needs to read the value under the pointer of a drawn chart: where the
/// plotting area lies in the drawing, what its axes span, and the points drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Readout {
    /// The drawing's width and height in pixels.
    pub size: (u32, u32),
    /// The plotting area in drawing pixels: left, top, right, bottom.
    pub area: (i32, i32, i32, i32),
    /// The values at the area's left and right edges.
    pub x_range: (f64, f64),
    /// The values at the area's bottom and top edges.
    pub y_range: (f64, f64),
    pub x_desc: String,
    pub y_desc: String,
    /// Each line as drawn (thinned), points in ascending x.
    pub lines: Vec<ReadoutLine>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadoutLine {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// An x value as a plain number, for the readout.
trait Number: Copy {
    fn number(self) -> f64;
}

impl Number for u64 {
    fn number(self) -> f64 {
        self as f64
    }
}

impl Number for f64 {
    fn number(self) -> f64 {
        self
    }
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: Chart,
    state: &RunState,
    theme: Theme,
) -> Result<Readout> {
    let palette = theme.palette();
    match chart {
        Chart::NoiseLevel => plot(root, noise_level_figure(state, &palette), &palette),
        _ => plot(root, step_figure(chart, state, &palette), &palette),
    }
}

fn plot<DB, X>(root: &DrawingArea<DB, Shift>, figure: Figure<X>, palette: &Palette) -> Result<Readout>
where
    DB: DrawingBackend,
    X: Number + PartialEq + 'static,
    Range<X>: AsRangedCoord<Value = X>,
    <Range<X> as AsRangedCoord>::CoordDescType: ValueFormatter<X>,
{
    let y_range = value_range(figure.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)));
    let text = |size: u32| (FONT, size).into_font().color(&palette.text);
    let x_range = (figure.x_range.start.number(), figure.x_range.end.number());

    root.fill(&palette.background).map_err(chart_error)?;
    let mut cc = ChartBuilder::on(root)
        .caption(figure.title, text(15))
        .margin(8)
        .x_label_area_size(34)
        .y_label_area_size(56)
        .build_cartesian_2d(figure.x_range, y_range.clone())
        .map_err(chart_error)?;
    cc.configure_mesh()
        .x_desc(figure.x_desc)
        .y_desc(figure.y_desc)
        .x_labels(6)
        .y_labels(5)
        .label_style(text(13))
        .axis_desc_style(text(13))
        .axis_style(palette.text)
        .bold_line_style(palette.grid)
        .light_line_style(palette.background)
        .draw()
        .map_err(chart_error)?;
    let (xs, ys) = cc.plotting_area().get_pixel_range();
    let mut lines = Vec::with_capacity(figure.lines.len());
    for line in &figure.lines {
        let style = line.style;
        let points = thin(&line.points);
        lines.push(ReadoutLine {
            name: line.name.clone(),
            points: points.iter().map(|&(x, y)| (x.number(), y)).collect(),
        });
        cc.draw_series(LineSeries::new(points, style).point_size(line.marker))
            .map_err(chart_error)?
            .label(line.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
    }
    cc.configure_series_labels()
        .position(figure.legend)
        .label_font(text(13))
        .background_style(palette.background.mix(0.8))
        .border_style(palette.grid)
        .draw()
        .map_err(chart_error)?;
    root.present().map_err(chart_error)?;
    let (width, height) = root.dim_in_pixel();
    Ok(Readout {
        size: (width, height),
        area: (xs.start, ys.start, xs.end, ys.end),
        x_range,
        y_range: (y_range.start, y_range.end),
        x_desc: figure.x_desc.into(),
        y_desc: figure.y_desc.into(),
        lines,
    })
}

/// A chart as an SVG document, with its readout.
#[derive(Debug, Clone)]
pub struct Drawn {
    pub svg: String,
    pub readout: Readout,
}

/// Draws `chart` of a run as an SVG document of `size` pixels.
pub fn render_svg(chart: Chart, state: &RunState, size: (u32, u32), theme: Theme) -> Result<Drawn> {
    ensure_font()?;
    let mut svg = String::new();
    let readout = {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root, chart, state, theme)?
    };
    Ok(Drawn { svg, readout })
}

/// Draws `chart` of a run into a PNG file of `size` pixels.
pub fn render_png(chart: Chart, state: &RunState, size: (u32, u32), theme: Theme, path: &Path) -> Result<()> {
    ensure_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    draw(&root, chart, state, theme).map(drop).map_err(|e| Error::Chart(format!("{}: {e}", path.display())))
}

/// Size of the charts `write_run_charts` writes.
pub const REPORT_SIZE: (u32, u32) = (960, 400);

/// Every chart of a run, replayed from its `events.jsonl`, into `out` as PNG and SVG
/// (`loss.png`, `loss.svg`, `noise-levels.png`, ...); each file is written to a
/// temporary name and renamed into place. Returns the files written.
pub fn write_run_charts(run_dir: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let state = RunState::replay(&read_events(&run_dir.join("events.jsonl"))?);
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut written = Vec::new();
    for chart in Chart::ALL {
        let stem = chart.file_stem();
        let png = out.join(format!("{stem}.png"));
        // The temporary name keeps the extension: the encoder is chosen by it.
        let tmp = out.join(format!(".{stem}.tmp.png"));
        render_png(chart, &state, REPORT_SIZE, Theme::Light, &tmp)?;
        std::fs::rename(&tmp, &png).map_err(|e| Error::io(&png, e))?;
        let svg = out.join(format!("{stem}.svg"));
        let tmp = out.join(format!(".{stem}.tmp.svg"));
        std::fs::write(&tmp, render_svg(chart, &state, REPORT_SIZE, Theme::Light)?.svg)
            .map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &svg).map_err(|e| Error::io(&svg, e))?;
        written.extend([png, svg]);
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
