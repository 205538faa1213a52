//! `sw-pool-enter SPEC`: pid 1 of an environment (see `swpool_env::init`). A binary of its own so
//! that every start loads only what pid 1 needs (no MPI, no OpenSSL: measured 2 ms per exec for
//! those libraries alone); `sw-pool __enter SPEC` does the same when this one is not installed.

fn main() {
    match std::env::args().nth(1) {
        Some(spec) => swpool_env::init::main(&spec),
        None => {
            eprintln!(
                "sw-pool-enter: started without a specification: it is started by `sw-pool run` and \
                 `sw-pool shell`, not by hand"
            );
            std::process::exit(swpool_env::EXIT_SETUP)
        }
    }
}
