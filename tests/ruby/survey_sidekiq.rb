# Fills a Redis with Sidekiq 6.4's own structures for `qbridge survey`'s
# tests, with Sidekiq's and gitlab-sidekiq-fetcher's own code (Debian's
# ruby-sidekiq, ruby-gitlab-sidekiq-fetcher, ruby-redis-namespace), against
# REDIS_URL, under the redis-namespace SIDEKIQ_NAMESPACE when it is set.
# Every job's arguments carry MARK (the tests assert it never reaches the
# survey's output):
#   - queue:default: 3 jobs (perform_async); schedule: 2 of default
#     (perform_in); dead: 1 of default (DeadSet#kill);
#   - queue:mailers: 2 jobs, one of them taken by gitlab-sidekiq-fetcher's
#     ReliableFetch into its working list (in flight);
#   - queue:failing: 1 Boom and queue:slow: 1 Slow, for a real worker
#     (survey_sidekiq_worker.rb);
#   - with ALONE=1 (no worker runs) instead: 1 job of default put in retry
#     by Sidekiq's retry handler, and one heartbeat of Sidekiq's launcher
#     (the process set and hash a running Sidekiq keeps).
# Prints nothing; exits non-zero on any error.
require "sidekiq"
require "sidekiq/api"
require "sidekiq/job_retry"
require "sidekiq/launcher"
require "sidekiq-reliable-fetch"

redis = { url: ENV.fetch("REDIS_URL") }
namespace = ENV.fetch("SIDEKIQ_NAMESPACE", "")
redis[:namespace] = namespace unless namespace.empty?
Sidekiq.redis = redis
Sidekiq.logger.level = Logger::WARN
mark = ENV.fetch("MARK")

class Mail
  include Sidekiq::Worker
  def perform(*); end
end

3.times { |i| Mail.perform_async(mark, i) }
2.times { |i| Mail.set(queue: "mailers").perform_async(mark, i) }
2.times { |i| Mail.perform_in(3600, mark, i) }
alone = ENV["ALONE"] == "1"
unless alone
  Sidekiq::Client.push("class" => "Boom", "queue" => "failing", "args" => [mark])
  Sidekiq::Client.push("class" => "Slow", "queue" => "slow", "args" => [mark])
end
dead = Sidekiq.dump_json("class" => "Mail", "args" => [mark], "queue" => "default", "jid" => "dead0000000000000000000a")
Sidekiq::DeadSet.new.kill(dead, notify_failure: false)

Sidekiq.options[:queues] = ["mailers"]
Sidekiq::ReliableFetch.new(Sidekiq.options).retrieve_work or raise "ReliableFetch took nothing"

if alone
  failed = Sidekiq.dump_json(
    "class" => "Mail", "args" => [mark], "queue" => "default", "jid" => "retry000000000000000000a",
    "retry" => true, "created_at" => Time.now.to_f, "enqueued_at" => Time.now.to_f
  )
  begin
    Sidekiq::JobRetry.new.global(failed, "default") { raise "boom" }
  rescue Sidekiq::JobRetry::Handled
    # The job is in the retry set; the handler says so by raising.
  end
  Sidekiq::Launcher.new(Sidekiq.options).send(:❤)
end
