//! Throwaway servers for tests that break them on purpose (the library's,
//! shared with `qbridge demo`): never the machine's shared ones.

pub use qbridge::demo::servers::{free_port, ServerTls, ThrowawayPostgres, ThrowawayRedis};
