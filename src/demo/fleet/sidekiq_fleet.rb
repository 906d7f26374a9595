# The Sidekiq side of `qbridge demo --framework sidekiq`: a real Sidekiq 6
# application (Debian's ruby-sidekiq) talking to Redis through qbridge's
# proxy. Written out by the demo and run as:
#   ruby sidekiq_fleet.rb produce N          N perform_async; prints "<jid>"
#   ruby sidekiq_fleet.rb schedule N SECONDS N perform_in;    prints "<jid>"
#   sidekiq -r ./sidekiq_fleet.rb -q QUEUE   the fleet's worker
#   qbridge-sidekiq-runner -r ./sidekiq_fleet.rb --listen ...
#                                            the Postgres side's handler
# The worker is the team's code, unchanged on both sides: it tells the
# demo's ledger it ran (its side effect; QBD_SIDE says which side ran it),
# and every fifth job fails its first attempt (the ledger says so) and is
# retried. The fleet reports outcomes with Qbridge::Sidekiq.report_outcomes!;
# in shadow, qbridge's runner calls perform_shadow instead.
#
# Environment: QBD_REDIS_URL (the proxy), QBD_QUEUE (the Sidekiq queue),
# QBD_LEDGER, QBD_SIDE, QBD_ADAPTERS (the adapters' lib), and the fleet's
# QBRIDGE_* settings.
require "net/http"
require "sidekiq"
$LOAD_PATH.unshift(ENV.fetch("QBD_ADAPTERS"))
require "qbridge/sidekiq"

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("QBD_REDIS_URL") } }
Sidekiq.logger.level = Logger::WARN

# A first attempt that fails (the ledger decides which).
class QbdFlaky < StandardError; end

class QbdDeliver
  include Sidekiq::Worker
  sidekiq_options queue: ENV.fetch("QBD_QUEUE"), retry: 3, qbridge_shadow: "dry_run"
  sidekiq_retry_in { |_count, _error| 1 }

  def perform(n)
    ledger(flaky: true) if n % 5 == 4
    ledger
    answer(n)
  end

  # Shadow: the same answer, no side effect.
  def perform_shadow(n)
    answer(n)
  end

  def answer(n)
    { "n" => n, "ok" => true }
  end

  def ledger(flaky: false)
    uri = URI(ENV.fetch("QBD_LEDGER"))
    headers = { "qbridge-job-key" => jid, "qbd-side" => ENV.fetch("QBD_SIDE", "redis") }
    headers["qbd-flaky"] = "1" if flaky
    response = Net::HTTP.start(uri.host, uri.port, open_timeout: 5, read_timeout: 10) do |http|
      http.post(uri.path, "", headers)
    end
    raise QbdFlaky if response.code == "409"
    raise "ledger answered #{response.code}" unless response.code.start_with?("2")
  end
end

# After the classes: in the server, these blocks run at once.
Sidekiq.configure_server do |c|
  c.redis = { url: ENV.fetch("QBD_REDIS_URL") }
  # Move due scheduled jobs and retries about every second (the default is
  # every 5 s, after a first wait of 10-15 s).
  Sidekiq.options[:poll_interval_average] = 1
end
# The fleet's whole configuration for qbridge: one line.
Qbridge::Sidekiq.report_outcomes! if ENV["QBRIDGE_OUTCOMES"]

if $PROGRAM_NAME == __FILE__
  # Each jid as it is pushed: a producer cut short still names its jobs.
  $stdout.sync = true
  case ARGV[0]
  when "produce" then ARGV[1].to_i.times { |i| puts QbdDeliver.perform_async(i) }
  when "schedule" then ARGV[1].to_i.times { |i| puts QbdDeliver.perform_in(ARGV[2].to_f, i) }
  else abort "usage: produce N | schedule N SECONDS"
  end
end
