//! The Lua scripts that finish a consumer's item atomically: the item
//! leaves its processing list and its inflight state in one step, so a crash
//! between the two cannot leave an item with stale state or state without
//! its item.

/// Ack: remove the item from the processing list, forget its state, give
/// up its running claim and remember that its job ran (the route's ran
/// set, trimmed to its retention), in one step. KEYS: processing, inflight,
/// dead (unused), ran, running. ARGV: item, job key, now (ms), oldest score
/// kept. Returns items removed.
pub(super) const ACK_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('DEL', KEYS[2])
if n > 0 then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[4])
end
if redis.call('HGET', KEYS[5], ARGV[2]) == KEYS[1] then redis.call('HDEL', KEYS[5], ARGV[2]) end
return n
"#;

/// Dead: move the item from the processing list to the dead list and forget
/// its state, in one step; an item no longer in the processing list is not
/// pushed (it would be a second copy). Its job ran (and failed): it joins
/// the ran set and gives up its claim as the ack does. KEYS: processing,
/// inflight, dead, ran, running. ARGV: item, job key, now (ms), oldest
/// score kept. Returns items moved.
pub(super) const DEAD_LUA: &str = r#"
local n = redis.call('LREM', KEYS[1], -1, ARGV[1])
if n > 0 then
  redis.call('LPUSH', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[4])
end
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[5], ARGV[2]) == KEYS[1] then redis.call('HDEL', KEYS[5], ARGV[2]) end
return n
"#;

/// Drop unrun: remove an item that must not run from its processing list,
/// forget its state and give up its claim, in one step; it joins neither
/// the ran set nor the dead list. KEYS: processing, inflight, running.
/// ARGV: item, job key.
pub(super) const DROP_LUA: &str = r#"
redis.call('LREM', KEYS[1], -1, ARGV[1])
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[3], ARGV[2]) == KEYS[1] then redis.call('HDEL', KEYS[3], ARGV[2]) end
return 1
"#;

/// Claim: whether an id key's job ran already (`ran`), else who runs it
/// (the processing list holding its item, returned), else this item's
/// claim to run it (`""`), taken over from `ARGV[3]` when that holder is
/// gone. KEYS: ran, running. ARGV: job key, this item's processing list,
/// the holder to take over from (or `""`).
pub(super) const CLAIM_LUA: &str = r#"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 'ran' end
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder and holder ~= ARGV[2] and holder ~= ARGV[3] then return holder end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return ''
"#;
