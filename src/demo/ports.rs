//! Ports for throwaway servers and qbridge processes that tests, the demo
//! and the fault suite start (and restart) on a port of their own.

use std::net::TcpListener;

/// A port nobody uses right now, below the kernel's ephemeral range. A
/// server is started on it again after a kill (the fault suite restarts
/// Postgres, Redis and qbridge's processes on their ports); a port from the
/// ephemeral range may meanwhile be the local port of some client
/// connection, and the restart then fails with "Address already in use"
/// (oracle seed 70668: a worker could not listen again, and its processing
/// lists never drained).
pub fn free_port() -> u16 {
    use rand::Rng;
    let below = ephemeral_low();
    if below > 12_000 {
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let port = rng.random_range(below - 10_000..below);
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The lowest port of the kernel's ephemeral range (Linux's
/// `ip_local_port_range`; 32768, its default, elsewhere).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    #[test]
    fn free_ports_are_below_the_ephemeral_range() {
        let low = super::ephemeral_low();
        for _ in 0..20 {
            let port = super::free_port();
            assert!(port < low, "{port} is in the ephemeral range from {low}");
            assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        }
    }
}
