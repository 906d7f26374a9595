//! `qbridge proxy`: the RESP proxy process ([`crate::app::proxy`]) until
//! SIGINT/SIGTERM.

use crate::config::Config;
use crate::error::Result;

pub async fn run(config: Config, listen: Option<&str>) -> Result<()> {
    // Installs the recorder before any metric is touched.
    crate::telemetry::prometheus();
    let routes: Vec<String> = config.routes.iter().map(|r| r.name.clone()).collect();
    crate::metrics::zero_series(&routes, &[]);
    crate::app::proxy::run(config, listen, crate::shutdown::on_signal()).await
}
