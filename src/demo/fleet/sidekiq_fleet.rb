# The Sidekiq side of `qbridge demo --framework sidekiq`: a real Sidekiq 6
# application (Debian's ruby-sidekiq) talking to Redis through qbridge's
# proxy. Written out by the demo and run as:
#   ruby sidekiq_fleet.rb produce N          N perform_async; prints "<jid>"
#   ruby sidekiq_fleet.rb schedule N SECONDS N perform_in;    prints "<jid>"
#   sidekiq -r ./sidekiq_fleet.rb -q QUEUE   the fleet's worker
# Each job tells the demo's ledger it ran (the stand-in for its side
# effect), and a server middleware reports its outcome to qbridge
# (POST /v1/outcomes), the way issue 15's reporter will.
#
# Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the Sidekiq queue),
# QBD_ROUTE_QUEUE (the route's Postgres queue), QBD_LEDGER, QBD_OUTCOMES.
require "json"
require "net/http"
require "sidekiq"

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("QBD_REDIS_URL") } }
Sidekiq.logger.level = Logger::WARN

module Qbd
  def self.post(url, body, headers = {})
    uri = URI(url)
    Net::HTTP.start(uri.host, uri.port, open_timeout: 5, read_timeout: 10) do |http|
      http.post(uri.path, body, { "content-type" => "application/json" }.merge(headers))
    end
  end

  # What a job "returns": the response both sides' digests are compared on.
  def self.answer(key)
    JSON.generate({ "key" => key, "ok" => true })
  end
end

# Reports each job's outcome to qbridge after it ran (ok) or raised (failed).
class QbdReportOutcome
  def call(_worker, job, _queue)
    yield
    report(job["jid"], "ok", Qbd.answer(job["jid"]))
  rescue StandardError => e
    report(job["jid"], "failed", e.class.name)
    raise
  end

  def report(jid, outcome, detail)
    body = { "queue" => ENV.fetch("QBD_ROUTE_QUEUE"), "key" => jid, "outcome" => outcome, "detail" => detail }
    Qbd.post(ENV.fetch("QBD_OUTCOMES"), JSON.generate(body))
  rescue StandardError => e
    # Never fail the job for its report: qbridge then says "unknown".
    Sidekiq.logger.warn("outcome report failed: #{e.class}")
  end
end

class QbdDeliver
  include Sidekiq::Worker
  sidekiq_options queue: ENV.fetch("QBD_QUEUE"), retry: 3

  def perform(_n)
    Qbd.post(ENV.fetch("QBD_LEDGER"), "", "qbridge-job-key" => jid, "qbd-side" => "redis")
  end
end

# After the classes: in the server, this block runs at once.
Sidekiq.configure_server do |c|
  c.redis = { url: ENV.fetch("QBD_REDIS_URL") }
  # Move due scheduled jobs about every second (the default is every 5 s,
  # after a first wait of 10-15 s).
  Sidekiq.options[:poll_interval_average] = 1
  c.server_middleware { |chain| chain.add(QbdReportOutcome) }
end

if $PROGRAM_NAME == __FILE__
  # Each jid as it is pushed: a producer cut short still names its jobs.
  $stdout.sync = true
  case ARGV[0]
  when "produce" then ARGV[1].to_i.times { |i| puts QbdDeliver.perform_async(i) }
  when "schedule" then ARGV[1].to_i.times { |i| puts QbdDeliver.perform_in(ARGV[2].to_f, i) }
  else abort "usage: produce N | schedule N SECONDS"
  end
end
