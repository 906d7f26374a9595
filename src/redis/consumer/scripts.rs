//! The Lua scripts that finish a consumer's item atomically: the item
//! leaves its processing list and its inflight state in one step, so a crash
//! between the two cannot leave an item with stale state or state without
//! its item.

/// Ack: remove the item from the processing list, forget its state and
/// remember that its job ran (the route's ran set, trimmed to its
/// retention), in one step. KEYS: processing, inflight, dead (unused), ran.
/// ARGV: item, job key, now (ms), oldest score kept. Returns items removed.
pub(super) const ACK_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('DEL', KEYS[2])
if n > 0 then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[4])
end
return n
"#;

/// Dead: move the item from the processing list to the dead list and forget
/// its state, in one step; an item no longer in the processing list is not
/// pushed (it would be a second copy). Its job ran (and failed): it joins
/// the ran set as the ack does. KEYS: processing, inflight, dead, ran.
/// ARGV: item, job key, now (ms), oldest score kept. Returns items moved.
pub(super) const DEAD_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
if n > 0 then
  redis.call('LPUSH', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[4])
end
redis.call('DEL', KEYS[2])
return n
"#;
