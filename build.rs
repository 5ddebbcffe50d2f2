//! Compiles `proto/` with the pure-Rust `protox` parser, so building needs no system `protoc`.

fn main() {
    const PROTO: &str = "ratelimit/config/ratelimit/v3/rls_conf.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = match protox::compile([PROTO], ["proto"]) {
        Ok(set) => set,
        Err(e) => panic!("cannot parse proto/{PROTO}: {e:?}"),
    };
    let generated = prost_build::Config::new()
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com")
        .compile_fds(descriptors);
    if let Err(e) = generated {
        panic!("cannot generate Rust for proto/{PROTO}: {e}");
    }
}
