//! Raw protobuf bytes → the server's strict decoder → edge conversion → decision. Malformed
//! bytes are INVALID_ARGUMENT, never a panic; whatever decodes is decided consistently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::rls::wire::decode_request;

#[path = "support.rs"]
mod sluice_fuzz_support;

use sluice_fuzz_support::{Harness, Policy};

fuzz_target!(|data: &[u8]| {
    match decode_request(data) {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains(':'), "{status:?}");
        }
        Ok(request) => Harness::new(Policy::default()).run(request),
    }
});
