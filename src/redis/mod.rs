//! The Redis side of a migration. So far: the list-item formats (job key and
//! byte-exact payload of Sidekiq, Celery, Resque, RQ, JSON and raw items).
//! Routes, mirroring, the producer API and the Redis consumer build on these.

pub mod formats;
