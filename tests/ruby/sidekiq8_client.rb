# Pushes jobs exactly as Sidekiq 8's client does, through any Redis URL.
# Sidekiq 8 needs Ruby 3.2 or later, which these machines lack, so this is a
# fixture written after its source (read, not copied) rather than Sidekiq 8
# itself. It follows, at the tags v8.0.8 and v8.1.7 of github.com/sidekiq/sidekiq:
#   - lib/sidekiq/client.rb: #push and #push_bulk (slices of `batch_size`,
#     1,000 by default; 8.1 uses 100 when jobs are scheduled), #raw_push (one
#     pipeline per push or slice) and #atomic_push: a ready slice is
#     `SADD queues <queue>…` then one `LPUSH queue:<queue> <json>…` per
#     queue, each job's `enqueued_at` set to the push's time in integer
#     milliseconds; a scheduled slice is one `ZADD schedule <score> <json>…`,
#     each score the job's `at` (float seconds since the epoch, as Ruby's
#     Float#to_s writes it) and the job without `at` or `enqueued_at`;
#   - lib/sidekiq/job_util.rb: #normalize_item (the class's options first,
#     then the item, a 24-hex-digit `jid`, `created_at` in integer
#     milliseconds);
#   - lib/sidekiq/job.rb: perform_in (`at` = now + interval, float seconds);
#     push_bulk's `at` may be one time or an Array, one time per job (one
#     ZADD with many scores);
#   - lib/sidekiq/config.rb: the default job options (retry: true, queue).
# The Redis client is redis-client (vendor/ruby), Sidekiq 8's own, speaking
# RESP3 (HELLO 3) as it does.
#
#   ruby sidekiq8_client.rb async N       N perform_async, one pipeline each
#   ruby sidekiq8_client.rb bulk N        push_bulk of N: slices of 1,000
#   ruby sidekiq8_client.rb in N SECONDS  N perform_in(SECONDS), one ZADD each
#   ruby sidekiq8_client.rb bulk_at N SECONDS
#                                         push_bulk of N with an `at` Array
#                                         (job i due SECONDS + i ms from now):
#                                         one ZADD per slice, many scores
# Prints "ready <jid>" or "scheduled <jid> <score>" per job.
# Environment: REDIS_URL, SIDEKIQ_QUEUE (default "emails"), and the class
# (SIDEKIQ_CLASS, default "WelcomeEmail": the sample app's worker).
require "json"
require "securerandom"
require "redis_client"

REDIS = RedisClient.config(url: ENV.fetch("REDIS_URL"), protocol: 3).new_client
QUEUE = ENV.fetch("SIDEKIQ_QUEUE", "emails")
CLASS = ENV.fetch("SIDEKIQ_CLASS", "WelcomeEmail")
BATCH = 1_000

def now_ms
  Process.clock_gettime(Process::CLOCK_REALTIME, :millisecond)
end

# A job as normalize_item leaves it: the class's options, then the item.
def job(args)
  { "retry" => true, "queue" => QUEUE, "class" => CLASS, "args" => args,
    "jid" => SecureRandom.hex(12), "created_at" => now_ms }
end

# One pipeline: ready jobs grouped by queue, or scheduled ones in one ZADD.
def raw_push(jobs)
  REDIS.pipelined do |p|
    if jobs.first.key?("at")
      p.call("ZADD", "schedule", jobs.flat_map { |j| [j["at"].to_s, JSON.generate(j.except("enqueued_at", "at"))] })
    else
      now = now_ms
      grouped = jobs.group_by { |j| j["queue"] }
      p.call("SADD", "queues", grouped.keys)
      grouped.each do |queue, group|
        p.call("LPUSH", "queue:#{queue}", group.map { |j| JSON.generate(j.merge("enqueued_at" => now)) })
      end
    end
  end
end

def report(jobs)
  jobs.each do |j|
    puts j.key?("at") ? "scheduled #{j['jid']} #{j['at']}" : "ready #{j['jid']}"
  end
end

$stdout.sync = true
n = ARGV.fetch(1).to_i
case ARGV[0]
when "async"
  n.times do |i|
    j = job([i])
    raw_push([j])
    report([j])
  end
when "bulk"
  (0...n).each_slice(BATCH) do |slice|
    jobs = slice.map { |i| job([i]) }
    raw_push(jobs)
    report(jobs)
  end
when "in"
  n.times do |i|
    j = job([i]).merge("at" => Time.now.to_f + ARGV.fetch(2).to_f)
    raw_push([j])
    report([j])
  end
when "bulk_at"
  start = Time.now.to_f + ARGV.fetch(2).to_f
  at = (0...n).map { |i| start + i / 1000.0 }
  (0...n).each_slice(BATCH) do |slice|
    jobs = slice.map { |i| job([i]).merge("at" => at[i]) }
    raw_push(jobs)
    report(jobs)
  end
else
  abort "usage: async N | bulk N | in N SECONDS | bulk_at N SECONDS"
end
