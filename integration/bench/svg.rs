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

pub fn render(title: &str, series: &[Series<'_>]) -> String {
    let offered = |r: &Report| r.offered_rps.unwrap_or(r.throughput_rps);
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

    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
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
        let sx = |x: f64| ox + x / x_max * pw;
        let step = nice_step(x_max, 6.0);
        let y_lin_max = x_max;
        let sy_lin = |y: f64| TOP + ph - y / y_lin_max * ph;
        let (llo, lhi) = (decade_lo.log10(), decade_hi.log10());
        let sy_log = |y: f64| TOP + ph - (y.max(decade_lo).log10() - llo) / (lhi - llo) * ph;
        let _ = writeln!(
            svg,
            r##"<rect x="{ox}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
        );
        // x ticks (offered load) on both panels
        let mut x = 0.0;
        while x <= x_max {
            let px = sx(x);
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
        if panel == 0 {
            let mut y = 0.0;
            while y <= y_lin_max {
                y_tick(&mut svg, ox, pw, sy_lin(y), &fmt_rate(y));
                y += step;
            }
            let _ = write!(
                svg,
                r##"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#aaa" stroke-dasharray="4 4"/>
<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">achieved throughput (requests/s)</text>
"##,
                sx(0.0),
                sy_lin(0.0),
                sx(x_max),
                sy_lin(x_max),
                ox - 66.0,
                TOP + ph / 2.0,
                ox - 66.0,
                TOP + ph / 2.0
            );
        } else {
            let mut d = decade_lo;
            while d <= decade_hi * 1.001 {
                y_tick(&mut svg, ox, pw, sy_log(d), &fmt_us(d));
                d *= 10.0;
            }
            let _ = writeln!(
                svg,
                r##"<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">latency (log): p50 solid, p99 dashed</text>"##,
                ox - 66.0,
                TOP + ph / 2.0,
                ox - 66.0,
                TOP + ph / 2.0
            );
        }

        for (i, s) in series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut pts: Vec<&Report> = s.points.iter().collect();
            pts.sort_by(|a, b| offered(a).total_cmp(&offered(b)));
            let lines: Vec<(Vec<(f64, f64)>, &str)> = if panel == 0 {
                vec![(
                    pts.iter()
                        .map(|r| (sx(offered(r)), sy_lin(r.throughput_rps)))
                        .collect(),
                    "",
                )]
            } else {
                vec![
                    (
                        pts.iter()
                            .map(|r| (sx(offered(r)), sy_log(r.latency.p50_us)))
                            .collect(),
                        "",
                    ),
                    (
                        pts.iter()
                            .map(|r| (sx(offered(r)), sy_log(r.latency.p99_us)))
                            .collect(),
                        r#" stroke-dasharray="6 3""#,
                    ),
                ]
            };
            for (line, dash) in lines {
                let path: Vec<String> =
                    line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
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
    }
    svg.push_str("</svg>\n");
    svg
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
