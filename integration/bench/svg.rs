//! A self-contained SVG of sweeps: achieved throughput vs offered load (left) and p50/p99
//! latency vs offered load on a log scale (right), one colour per target.

use std::fmt::Write;

use crate::load::Report;

const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const W: f64 = 480.0;
const H: f64 = 400.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

pub struct Series<'a> {
    pub label: &'a str,
    pub points: &'a [Report],
}

/// 1, 2, 5 × 10^k steps giving about `n` ticks over 0..max.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn fmt_rate(v: f64) -> String {
    if v >= 1_000.0 {
        format!("{}k", (v / 1_000.0 * 10.0).round() / 10.0)
    } else {
        format!("{v:.0}")
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{} s", v / 1_000_000.0)
    } else if v >= 1_000.0 {
        format!("{} ms", v / 1_000.0)
    } else {
        format!("{v} µs")
    }
}

/// The scales both panels share: offered load (and throughput) on x, latency in whole decades.
struct Scales {
    x_max: f64,
    decade_lo: f64,
    decade_hi: f64,
    /// Plot width and height of one panel.
    pw: f64,
    ph: f64,
}

impl Scales {
    fn new(series: &[Series<'_>]) -> Scales {
        let all = series.iter().flat_map(|s| s.points.iter());
        let x_max = all
            .clone()
            .map(|r| offered(r).max(r.throughput_rps))
            .fold(1.0, f64::max)
            * 1.05;
        let lat_vals = all
            .clone()
            .flat_map(|r| [r.latency.p50_us, r.latency.p99_us])
            .filter(|v| *v > 0.0);
        let lat_min = lat_vals.clone().fold(f64::MAX, f64::min).min(1e6);
        let lat_max = lat_vals.fold(1.0, f64::max);
        let decade_lo = 10f64.powf(lat_min.log10().floor());
        let decade_hi = 10f64.powf(lat_max.log10().ceil()).max(decade_lo * 10.0);
        Scales {
            x_max,
            decade_lo,
            decade_hi,
            pw: W - LEFT - RIGHT,
            ph: H - TOP - BOTTOM,
        }
    }

    /// x of the panel whose plot area starts at `ox`.
    fn sx(&self, ox: f64, x: f64) -> f64 {
        ox + x / self.x_max * self.pw
    }

    /// y on the linear throughput scale (same range as x).
    fn sy_lin(&self, y: f64) -> f64 {
        TOP + self.ph - y / self.x_max * self.ph
    }

    /// y on the logarithmic latency scale.
    fn sy_log(&self, y: f64) -> f64 {
        let (llo, lhi) = (self.decade_lo.log10(), self.decade_hi.log10());
        TOP + self.ph - (y.max(self.decade_lo).log10() - llo) / (lhi - llo) * self.ph
    }
}

/// The offered load of a point; the closed-loop peak is placed at its throughput.
fn offered(r: &Report) -> f64 {
    r.offered_rps.unwrap_or(r.throughput_rps)
}

pub fn render(title: &str, series: &[Series<'_>]) -> String {
    let scales = Scales::new(series);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}</text>
"##,
        2.0 * W,
        H + 20.0,
        W,
        escape(title)
    );
    for panel in 0..2 {
        let ox = panel as f64 * W + LEFT;
        x_axis(&mut svg, &scales, ox);
        if panel == 0 {
            throughput_axis(&mut svg, &scales, ox);
        } else {
            latency_axis(&mut svg, &scales, ox);
        }
        for (i, s) in series.iter().enumerate() {
            plot_series(&mut svg, &scales, panel, i, s);
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// The panel's frame and the offered-load ticks and label (both panels).
fn x_axis(svg: &mut String, scales: &Scales, ox: f64) {
    let (pw, ph) = (scales.pw, scales.ph);
    let _ = writeln!(
        svg,
        r##"<rect x="{ox}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let step = nice_step(scales.x_max, 6.0);
    let mut x = 0.0;
    while x <= scales.x_max {
        let px = scales.sx(ox, x);
        let _ = writeln!(
            svg,
            r##"<line x1="{px}" y1="{TOP}" x2="{px}" y2="{}" stroke="#eee"/><text x="{px}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            fmt_rate(x)
        );
        x += step;
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" text-anchor="middle">offered load (requests/s; peak = closed loop)</text>"##,
        ox + pw / 2.0,
        TOP + ph + 36.0
    );
}

/// Left panel: linear throughput ticks, the achieved = offered diagonal and the axis label.
fn throughput_axis(svg: &mut String, scales: &Scales, ox: f64) {
    let step = nice_step(scales.x_max, 6.0);
    let mut y = 0.0;
    while y <= scales.x_max {
        y_tick(svg, ox, scales.pw, scales.sy_lin(y), &fmt_rate(y));
        y += step;
    }
    let _ = write!(
        svg,
        r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#aaa" stroke-dasharray="4 4"/>
<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">achieved throughput (requests/s)</text>
"##,
        scales.sx(ox, 0.0),
        scales.sy_lin(0.0),
        scales.sx(ox, scales.x_max),
        scales.sy_lin(scales.x_max),
        ox - 66.0,
        TOP + scales.ph / 2.0,
        ox - 66.0,
        TOP + scales.ph / 2.0
    );
}

/// Right panel: one tick per latency decade and the axis label.
fn latency_axis(svg: &mut String, scales: &Scales, ox: f64) {
    let mut d = scales.decade_lo;
    while d <= scales.decade_hi * 1.001 {
        y_tick(svg, ox, scales.pw, scales.sy_log(d), &fmt_us(d));
        d *= 10.0;
    }
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">latency (log): p50 solid, p99 dashed</text>"##,
        ox - 66.0,
        TOP + scales.ph / 2.0,
        ox - 66.0,
        TOP + scales.ph / 2.0
    );
}

/// Series `i` on `panel`: throughput (left, with its legend entry) or p50 and p99 (right).
fn plot_series(svg: &mut String, scales: &Scales, panel: usize, i: usize, s: &Series<'_>) {
    let ox = panel as f64 * W + LEFT;
    let colour = COLOURS[i % COLOURS.len()];
    let mut pts: Vec<&Report> = s.points.iter().collect();
    pts.sort_by(|a, b| offered(a).total_cmp(&offered(b)));
    let line = |y: &dyn Fn(&Report) -> f64| -> Vec<(f64, f64)> {
        pts.iter()
            .map(|r| (scales.sx(ox, offered(r)), y(r)))
            .collect()
    };
    let lines: Vec<(Vec<(f64, f64)>, &str)> = if panel == 0 {
        vec![(line(&|r| scales.sy_lin(r.throughput_rps)), "")]
    } else {
        vec![
            (line(&|r| scales.sy_log(r.latency.p50_us)), ""),
            (
                line(&|r| scales.sy_log(r.latency.p99_us)),
                r#" stroke-dasharray="6 3""#,
            ),
        ]
    };
    for (line, dash) in lines {
        let path: Vec<String> = line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for (x, y) in line {
            let _ = write!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
        svg.push('\n');
    }
    if panel == 0 {
        let ly = TOP + 16.0 + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{}</text>"#,
            ox + 10.0,
            ly - 10.0,
            ox + 28.0,
            ly,
            escape(s.label)
        );
    }
}

/// A horizontal grid line across the panel at `py`, labelled on the left.
fn y_tick(svg: &mut String, ox: f64, pw: f64, py: f64, label: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{ox}" y1="{py}" x2="{}" y2="{py}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
        ox + pw,
        ox - 6.0,
        py + 4.0,
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(100_000.0, 6.0), 20_000.0);
        assert_eq!(nice_step(7.0, 6.0), 2.0);
        assert_eq!(fmt_rate(25_000.0), "25k");
        assert_eq!(fmt_us(1_000.0), "1 ms");
        assert_eq!(fmt_us(10_000_000.0), "10 s");
    }
}
