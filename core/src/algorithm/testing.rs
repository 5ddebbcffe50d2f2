//! What the algorithms' unit tests share: demands and one-key decisions through [`decide`].

use super::*;

/// A take of `tokens` hits by `algorithm`.
pub fn take(algorithm: Algorithm, params: BucketParams, tokens: u64) -> Demand {
    Demand::take(algorithm, params, tokens)
}

/// An always-charged take (`charge: always`) of `tokens` hits by `algorithm`.
pub fn charge(algorithm: Algorithm, params: BucketParams, tokens: u64) -> Demand {
    Demand {
        always: true,
        ..take(algorithm, params, tokens)
    }
}

/// An algorithm's own state, as [`State`] holds it.
pub trait Stored: Copy + std::fmt::Debug {
    fn wrap(self) -> State;
    fn unwrap(state: State) -> Option<Self>;
}

macro_rules! stored {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl Stored for $ty {
            fn wrap(self) -> State {
                State::$variant(self)
            }
            fn unwrap(state: State) -> Option<Self> {
                match state {
                    State::$variant(s) => Some(s),
                    _ => None,
                }
            }
        }
    )*};
}

stored!(
    BucketState => TokenBucket,
    WindowState => FixedWindow,
    SlidingState => SlidingWindow,
    GcraState => Gcra,
);

/// Decides one demand against one state (the real two-phase [`decide`]); the verdict and the
/// state to store.
pub fn decide_one<S: Stored>(now_ms: u64, demand: Demand, state: Option<S>) -> (Verdict, S) {
    let mut states = [state.map(S::wrap)];
    let verdicts = decide(now_ms, &[demand], &mut states);
    let stored = states[0]
        .and_then(S::unwrap)
        .unwrap_or_else(|| panic!("{demand:?} stored {:?}", states[0]));
    (verdicts[0], stored)
}
