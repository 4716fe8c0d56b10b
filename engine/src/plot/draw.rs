//! The SVG: a title, then the panels in a grid, each with its header (caption, legend,
//! non-finite note) above its chart.

use super::PlotOptions;
use super::panels::{Panel, Role, choose_panels, shown_sources};
use super::read::{RunMetrics, Series, is_validation};
use anyhow::{anyhow, ensure};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width of one panel, and height of its chart below the header, in pixels.
const PANEL_WIDTH: u32 = 460;
const CHART_HEIGHT: u32 = 290;
/// Height of one header row (caption, legend, non-finite note) and of one title line.
const ROW_HEIGHT: u32 = 18;
const TITLE_LINE_HEIGHT: u32 = 24;
/// Colours of lines: by role within a panel for one run, by run for several (no red: red marks
/// non-finite values).
const PALETTE: &[RGBColor] = &[
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x7f, 0x7f, 0x7f),
];
const NON_FINITE_COLOUR: RGBColor = RGBColor(0xd6, 0x27, 0x28);

/// TensorBoard's debiased exponential moving average of the finite values of `series`:
/// `s_t = weight·s_{t−1} + (1 − weight)·x_t`, divided by `1 − weight^t`; `None` stays `None`.
pub fn smooth(series: &[(u64, Option<f64>)], weight: f64) -> Series {
    let (mut average, mut count) = (0.0, 0);
    series
        .iter()
        .map(|&(step, value)| {
            let smoothed = value.map(|x| {
                average = weight * average + (1.0 - weight) * x;
                count += 1;
                average / (1.0 - weight.powi(count))
            });
            (step, smoothed)
        })
        .collect()
}

/// A line as drawn for one run.
struct DrawnLine<'a> {
    label: String,
    colour: RGBColor,
    /// Markers at each value, for sparse series.
    marker: Option<Marker>,
    values: &'a Series,
    /// The moving average drawn over `values` (then drawn faint), when smoothing.
    smoothed: Option<Series>,
}

#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
}

/// The lines of `panel` for each run that has them, coloured by role for one run and by run for
/// several.
fn drawn_lines<'a>(
    panel: &Panel,
    runs: &'a [RunMetrics],
    options: &PlotOptions,
) -> Vec<DrawnLine<'a>> {
    let mut out = Vec::new();
    for (run_index, run) in runs.iter().enumerate() {
        let shown = shown_sources(run);
        let mut source_index = 0;
        for line in &panel.lines {
            let is_source = matches!(line.role, Role::ValSource(_));
            let role_index = match &line.role {
                Role::Only | Role::Train => 0,
                Role::Val => 1,
                Role::ValSource(_) => {
                    source_index += 1;
                    1 + source_index
                }
            };
            let Some(values) = run.series.get(&line.key) else {
                continue;
            };
            if is_source && !shown.contains_key(&line.key) {
                continue;
            }
            let sparse = run.is_sparse(&line.key);
            let (colour, label) = if runs.len() == 1 {
                (PALETTE[role_index % PALETTE.len()], line.role.label())
            } else {
                let label = format!("{} {}", run.name, line.role.label());
                (
                    PALETTE[run_index % PALETTE.len()],
                    label.trim_end().to_string(),
                )
            };
            let marker = sparse.then_some(if is_source && runs.len() > 1 {
                Marker::Triangle
            } else {
                Marker::Circle
            });
            let smoothed = (options.smooth > 0.0 && !sparse && !is_validation(&line.key))
                .then(|| smooth(values, options.smooth));
            out.push(DrawnLine {
                label,
                colour,
                marker,
                values,
                smoothed,
            });
        }
    }
    out
}

/// "non-finite at steps …" for the lines of a panel that have non-finite values, naming the line
/// when the panel has several.
fn non_finite_note(lines: &[DrawnLine]) -> Option<String> {
    let groups: Vec<String> = lines
        .iter()
        .filter_map(|line| {
            let steps: Vec<u64> = line
                .values
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(s, _)| *s)
                .collect();
            if steps.is_empty() {
                return None;
            }
            let mut text = step_list(&steps);
            if lines.len() > 1 && !line.label.is_empty() {
                text.push_str(&format!(" ({})", line.label));
            }
            Some(text)
        })
        .collect();
    (!groups.is_empty()).then(|| format!("non-finite at steps {}", groups.join("; ")))
}

/// `steps` as a list, the first eight and the count when longer.
fn step_list(steps: &[u64]) -> String {
    const SHOWN: usize = 8;
    let list: Vec<String> = steps.iter().take(SHOWN).map(u64::to_string).collect();
    if steps.len() > SHOWN {
        format!("{} … ({} in all)", list.join(", "), steps.len())
    } else {
        list.join(", ")
    }
}

/// Estimated width in pixels of `text` at `size` (SVG text is laid out by the viewer; this only
/// places legend entries).
fn text_width(text: &str, size: f64) -> i32 {
    (text.chars().count() as f64 * size * 0.58).ceil() as i32
}

const LEGEND_FONT: f64 = 12.0;
const SWATCH: i32 = 20;

/// The legend's entries of `lines` as rows of (line, x offset), wrapped to `width`.
fn legend_rows<'a>(lines: &'a [DrawnLine<'a>], width: i32) -> Vec<Vec<(&'a DrawnLine<'a>, i32)>> {
    let mut rows: Vec<Vec<(&DrawnLine, i32)>> = Vec::new();
    let mut x = 0;
    for line in lines.iter().filter(|l| !l.label.is_empty()) {
        let entry = SWATCH + 4 + text_width(&line.label, LEGEND_FONT) + 14;
        if rows.is_empty() || (x + entry > width && x > 0) {
            rows.push(Vec::new());
            x = 0;
        }
        rows.last_mut().expect("a row").push((line, x));
        x += entry;
    }
    rows
}

fn svg_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the SVG: {e}")
}

/// The SVG of `runs`: a title line per run (its name and graph file), then the panels, three per
/// row.
pub fn render_svg(runs: &[RunMetrics], options: &PlotOptions) -> anyhow::Result<String> {
    let panels = choose_panels(runs);
    ensure!(!panels.is_empty(), "no metric to plot");
    let lines: Vec<Vec<DrawnLine>> = panels
        .iter()
        .map(|p| drawn_lines(p, runs, options))
        .collect();
    let legend_width = PANEL_WIDTH as i32 - 24;
    let legend_row_count = lines
        .iter()
        .map(|l| legend_rows(l, legend_width).len())
        .max()
        .unwrap_or(0) as u32;
    let has_notes = lines.iter().any(|l| non_finite_note(l).is_some());
    let header_height = 8 + ROW_HEIGHT * (1 + legend_row_count + u32::from(has_notes));

    let steps = runs.iter().flat_map(|r| r.steps.iter().copied());
    let (first, last) = steps.fold((u64::MAX, 0), |(a, b), s| (a.min(s), b.max(s)));
    // Padded so that markers at the first and last steps are drawn whole.
    let x_pad = ((last.saturating_sub(first)) as f64 * 0.02).max(0.25);
    let x_range = (first as f64 - x_pad, last as f64 + x_pad);

    let cols = panels.len().clamp(1, 3);
    let nrows = panels.len().div_ceil(cols);
    let title_height = 12 + TITLE_LINE_HEIGHT * runs.len() as u32;
    let panel_height = header_height + CHART_HEIGHT;
    let size = (
        PANEL_WIDTH * cols as u32,
        title_height + panel_height * nrows as u32,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(svg_error)?;
        let (title_area, body) = root.split_vertically(title_height);
        draw_title(&title_area, runs)?;
        let areas = body.split_evenly((nrows, cols));
        for ((panel, lines), area) in panels.iter().zip(&lines).zip(&areas) {
            draw_panel(area, panel, lines, x_range, header_height, legend_width)?;
        }
        root.present().map_err(svg_error)?;
    }
    Ok(svg)
}

/// One line per run: its name and graph file, in the run's colour when there are several.
fn draw_title(area: &DrawingArea<SVGBackend, Shift>, runs: &[RunMetrics]) -> anyhow::Result<()> {
    let centre = area.dim_in_pixel().0 as i32 / 2;
    for (i, run) in runs.iter().enumerate() {
        let text = match &run.graph_file {
            Some(graph) => format!("{} — {graph}", run.name),
            None => run.name.clone(),
        };
        let colour = if runs.len() == 1 {
            BLACK
        } else {
            PALETTE[i % PALETTE.len()]
        };
        let style = TextStyle::from(("sans-serif", 19, FontStyle::Bold).into_font())
            .color(&colour)
            .pos(Pos::new(HPos::Center, VPos::Top));
        let y = 8 + TITLE_LINE_HEIGHT as i32 * i as i32;
        area.draw_text(&text, &style, (centre, y))
            .map_err(svg_error)?;
    }
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    panel: &Panel,
    lines: &[DrawnLine],
    (x0, x1): (f64, f64),
    header_height: u32,
    legend_width: i32,
) -> anyhow::Result<()> {
    let (header, plot_area) = area.split_vertically(header_height);
    let centre = PANEL_WIDTH as i32 / 2;
    let caption = TextStyle::from(("sans-serif", 15).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    header
        .draw_text(&panel.caption(), &caption, (centre, 6))
        .map_err(svg_error)?;
    let mut y = 6 + ROW_HEIGHT as i32;
    for row in legend_rows(lines, legend_width) {
        let width: i32 = row.last().map_or(0, |(l, x)| {
            x + SWATCH + 4 + text_width(&l.label, LEGEND_FONT)
        });
        let left = (PANEL_WIDTH as i32 - width) / 2;
        for (line, x) in row {
            let (sx, sy) = (left + x, y + 7);
            let style = line.colour.stroke_width(2);
            header
                .draw(&PathElement::new(vec![(sx, sy), (sx + SWATCH, sy)], style))
                .map_err(svg_error)?;
            let centre = (sx + SWATCH / 2, sy);
            match line.marker {
                Some(Marker::Circle) => header.draw(&Circle::new(centre, 4, line.colour.filled())),
                Some(Marker::Triangle) => {
                    header.draw(&TriangleMarker::new(centre, 5, line.colour.filled()))
                }
                None => Ok(()),
            }
            .map_err(svg_error)?;
            let text = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Top));
            header
                .draw_text(&line.label, &text, (sx + SWATCH + 4, y))
                .map_err(svg_error)?;
        }
        y += ROW_HEIGHT as i32;
    }
    let note = non_finite_note(lines);
    if let Some(note) = &note {
        let style = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
            .color(&NON_FINITE_COLOUR)
            .pos(Pos::new(HPos::Center, VPos::Top));
        header
            .draw_text(
                note,
                &style,
                (centre, header_height as i32 - ROW_HEIGHT as i32),
            )
            .map_err(svg_error)?;
    }

    let finite = lines
        .iter()
        .flat_map(|l| l.values.iter().filter_map(|(_, v)| *v));
    let (low, high) = finite.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = if low > high {
        (0.0, 1.0)
    } else if low == high {
        (low - 0.5, high + 0.5)
    } else {
        let pad = (high - low) * 0.05;
        // Room at the top for the non-finite markers.
        let top = if note.is_some() { 2.5 * pad } else { pad };
        (low - pad, high + top)
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(8)
        .margin_top(2)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(svg_error)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .x_labels(6)
        // Steps are whole numbers: a tick between two is left unlabelled.
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_labels(6)
        .draw()
        .map_err(svg_error)?;

    for line in lines {
        let main_style = line.colour.stroke_width(2);
        if let Some(smoothed) = &line.smoothed {
            draw_segments(
                &mut chart,
                line.values,
                line.colour.mix(0.3).stroke_width(1),
                false,
            )?;
            draw_segments(&mut chart, smoothed, main_style, false)?;
        } else {
            draw_segments(&mut chart, line.values, main_style, line.marker.is_some())?;
        }
        if let Some(marker) = line.marker {
            let points = line
                .values
                .iter()
                .filter_map(|(s, v)| Some((*s as f64, (*v)?)));
            let style = line.colour.filled();
            match marker {
                Marker::Circle => chart
                    .draw_series(points.map(|p| Circle::new(p, 4, style)))
                    .map(|_| ()),
                Marker::Triangle => chart
                    .draw_series(points.map(|p| TriangleMarker::new(p, 5, style)))
                    .map(|_| ()),
            }
            .map_err(svg_error)?;
        }
    }
    let marker_y = y1 - (y1 - y0) * 0.03;
    let crosses = lines.iter().flat_map(|l| {
        l.values
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(move |(s, _)| {
                Cross::new((*s as f64, marker_y), 5, NON_FINITE_COLOUR.stroke_width(2))
            })
    });
    chart.draw_series(crosses).map_err(svg_error)?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws `values` as lines broken where a value is non-finite, dashed for a sparse series; a
/// point with no finite neighbour in a solid line is drawn as a dot.
fn draw_segments(
    chart: &mut Chart,
    values: &Series,
    style: ShapeStyle,
    dashed: bool,
) -> anyhow::Result<()> {
    let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (step, value) in values {
        match value {
            Some(v) => segments
                .last_mut()
                .expect("a segment")
                .push((*step as f64, *v)),
            None => segments.push(Vec::new()),
        }
    }
    for segment in segments.into_iter().filter(|s| !s.is_empty()) {
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(segment, 5, 4, style))
                .map_err(svg_error)?;
        } else if let [point] = segment[..] {
            chart
                .draw_series(std::iter::once(Circle::new(point, 2, style.filled())))
                .map_err(svg_error)?;
        } else {
            chart
                .draw_series(LineSeries::new(segment, style))
                .map_err(svg_error)?;
        }
    }
    Ok(())
}
