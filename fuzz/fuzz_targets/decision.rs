//! Request → decision: arbitrary requests through the edge conversion (with an arbitrary caller
//! policy) and the limiter on the memory backend with a manual clock, several requests in a
//! row. Every request gets INVALID_ARGUMENT or a consistent decision, and the store stays
//! within its bounds.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use sluice_fuzz_support::{FuzzRequest, Harness, Policy, to_proto};

#[path = "support.rs"]
mod sluice_fuzz_support;

#[derive(Arbitrary, Debug)]
struct Input {
    policy: Policy,
    steps: Vec<(FuzzRequest, u16)>,
}

fuzz_target!(|input: Input| {
    let harness = Harness::new(input.policy);
    for (request, advance_ms) in input.steps.iter().take(32) {
        harness.run(to_proto(request));
        harness.clock.advance(u64::from(*advance_ms));
    }
});
