//! A breaker's rolling account of one endpoint's recent calls, counted in *moments*: spans of one
//! Redis deadline (`--redis-timeout`). Every call that ends within one moment belongs to it, and a
//! moment counts as failed when more of its calls failed than succeeded. One stall seen by many
//! callers at once is therefore one failed moment per deadline it lasts, however many calls were
//! in flight: timed-out calls end one deadline after they started, so calls that started within
//! one deadline of each other end within one moment. The window keeps the moments of its last
//! [`BUCKETS`] buckets (each a tenth of `--breaker-window`) plus the moment in progress.
//!
//! Pure: time is an argument.

/// Buckets of one window: it slides by a tenth of its length.
const BUCKETS: u64 = 10;

/// Moments seen, and how many of them failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub moments: u32,
    pub failed: u32,
}

/// The lengths a window is cut in, in ms (each at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub moment_ms: u64,
    pub bucket_ms: u64,
}

impl Shape {
    pub fn new(moment_ms: u64, window_ms: u64) -> Shape {
        Shape {
            moment_ms: moment_ms.max(1),
            bucket_ms: (window_ms / BUCKETS).max(1),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bucket {
    index: u64,
    tally: Tally,
}

/// The calls that ended within one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Moment {
    index: u64,
    ok: u32,
    failed: u32,
}

impl Moment {
    fn has_failed(&self) -> bool {
        self.failed > self.ok
    }
}

/// See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    buckets: [Bucket; BUCKETS as usize],
    current: Option<Moment>,
}

impl Window {
    /// Counts one call that ended at `now_ms`; returns the window's tally at `now_ms`, the moment
    /// in progress included (as failed while most of its calls so far failed). A call reported
    /// with a time before the moment in progress (callers read the clock before they queue for
    /// the breaker) counts in that moment.
    pub fn record(&mut self, ok: bool, now_ms: u64, shape: Shape) -> Tally {
        let index = (now_ms / shape.moment_ms).max(self.current.map_or(0, |m| m.index));
        let moment = match self.current {
            Some(moment) if moment.index == index => moment,
            previous => {
                if let Some(done) = previous {
                    self.close(done, shape);
                }
                Moment {
                    index,
                    ok: 0,
                    failed: 0,
                }
            }
        };
        self.current = Some(Moment {
            ok: moment.ok + u32::from(ok),
            failed: moment.failed + u32::from(!ok),
            ..moment
        });
        self.tally(now_ms, shape)
    }

    /// The moments of the last window at `now_ms`, the one in progress included.
    pub fn tally(&self, now_ms: u64, shape: Shape) -> Tally {
        let newest = now_ms / shape.bucket_ms;
        let mut tally = self
            .buckets
            .iter()
            .filter(|b| b.index <= newest && b.index + BUCKETS > newest)
            .fold(Tally::default(), |sum, b| Tally {
                moments: sum.moments + b.tally.moments,
                failed: sum.failed + b.tally.failed,
            });
        if let Some(moment) = self.current {
            tally.moments += 1;
            tally.failed += u32::from(moment.has_failed());
        }
        tally
    }

    /// Files a finished moment in the bucket of its start; one older than that bucket's
    /// current contents is dropped (it left the window already).
    fn close(&mut self, moment: Moment, shape: Shape) {
        let index = moment.index * shape.moment_ms / shape.bucket_ms;
        let bucket = &mut self.buckets[(index % BUCKETS) as usize];
        if bucket.index < index {
            *bucket = Bucket {
                index,
                tally: Tally::default(),
            };
        } else if bucket.index > index {
            return;
        }
        bucket.tally.moments += 1;
        bucket.tally.failed += u32::from(moment.has_failed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        moment_ms: 15,
        bucket_ms: 100,
    };

    #[test]
    fn calls_ending_within_one_moment_count_once_by_their_majority() {
        let mut w = Window::default();
        for _ in 0..32 {
            w.record(false, 1_005, SHAPE);
        }
        assert_eq!(
            w.record(true, 1_019, SHAPE),
            Tally {
                moments: 1,
                failed: 1
            }
        );
        // The next moment: mostly successes, so healthy despite a failure.
        w.record(false, 1_020, SHAPE);
        w.record(true, 1_021, SHAPE);
        assert_eq!(
            w.record(true, 1_025, SHAPE),
            Tally {
                moments: 2,
                failed: 1
            }
        );
    }

    #[test]
    fn moments_leave_the_window_after_ten_buckets() {
        let mut w = Window::default();
        // The moment of 1_005..1_020 starts in the bucket of 1_000..1_100.
        w.record(false, 1_005, SHAPE);
        w.record(true, 1_050, SHAPE);
        assert_eq!(w.tally(1_999, SHAPE).failed, 1);
        assert_eq!(w.tally(2_000, SHAPE).failed, 0);
        assert_eq!(w.tally(2_000, SHAPE).moments, 1, "the one in progress");
        // A late report joins the moment in progress rather than reopening an old one.
        assert_eq!(w.record(false, 1_049, SHAPE).moments, 2);
    }
}
