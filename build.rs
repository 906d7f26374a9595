//! Rebuilds when a migration is added or changed: `sqlx::migrate!` embeds
//! the `migrations/` directory at compile time, and cargo does not watch
//! it on its own (a new file was otherwise missed until the crate changed).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
