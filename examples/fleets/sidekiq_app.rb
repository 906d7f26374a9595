# A Sidekiq application moving to qbridge: the one sample Sidekiq app of the
# repository. The examples (README, examples/fleets/qbridge.toml), the
# migration drill (`qbridge demo --framework sidekiq` embeds this file) and
# the integration tests (tests/it, tests/ruby) all run it. It runs unchanged
# on Sidekiq 6, 7 and 8: it uses no API one of them lacks.
#
# Two lines are qbridge's (marked); the worker is the team's code, unchanged
# except its shadow declaration. With the adapter's lib on the load path
# (RUBYLIB=adapters/ruby/lib, or the qbridge-sidekiq gem in the Gemfile):
#
#   fleet:    QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=emails \
#             sidekiq -r ./examples/fleets/sidekiq_app.rb -q emails
#   runner:   qbridge-sidekiq-runner -r ./examples/fleets/sidekiq_app.rb --listen 127.0.0.1:8091
#   produce:  REDIS_URL=redis://127.0.0.1:6380 ruby examples/fleets/sidekiq_app.rb produce 10
#   schedule: ruby examples/fleets/sidekiq_app.rb schedule 10 SECONDS   (perform_in)
#
# The producer prints each job's jid as it pushes it.
#
# Environment: REDIS_URL (default redis://127.0.0.1:6379), SIDEKIQ_QUEUE
# (default "emails"). The drill and the tests also give QBD_LEDGER, a ledger
# the delivery tells (its side effect, which the drill counts; QBD_SIDE says
# which side ran it): when it is given, every fifth user's (user_id % 5 == 4)
# first attempt fails, because the ledger says so, and Sidekiq (or qbridge,
# through the runner) retries it.
require "net/http"
require "sidekiq"
require "qbridge/sidekiq" # qbridge

REDIS_URL = ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379")
SIDEKIQ_QUEUE = ENV.fetch("SIDEKIQ_QUEUE", "emails")

Sidekiq.configure_client { |c| c.redis = { url: REDIS_URL } }
Sidekiq.logger.level = Logger::WARN

# A first attempt that the ledger made fail.
class DeliveryRefused < StandardError; end

class WelcomeEmail
  include Sidekiq::Job # Sidekiq::Worker before 6.3; both names since
  # In shadow, qbridge's runner calls perform_shadow: the same answer, no email.
  sidekiq_options queue: SIDEKIQ_QUEUE, qbridge_shadow: "dry_run"
  # Retry after a second: Sidekiq's default backoff (15 s and more) is
  # longer than the drill's phases.
  sidekiq_retry_in { |_count, _error| 1 }

  def perform(user_id)
    deliver(user_id)
    answer(user_id)
  end

  def perform_shadow(user_id)
    answer(user_id)
  end

  private

  def answer(user_id)
    { "user" => user_id, "template" => "welcome" }
  end

  # Delivers the email: here, tells the ledger when there is one.
  def deliver(user_id)
    ledger = ENV["QBD_LEDGER"]
    return if ledger.nil? || ledger.empty?

    tell(ledger, flaky: true) if user_id % 5 == 4
    tell(ledger)
  end

  def tell(ledger, flaky: false)
    uri = URI(ledger)
    headers = { "qbridge-job-key" => jid, "qbd-side" => ENV.fetch("QBD_SIDE", "redis") }
    headers["qbd-flaky"] = "1" if flaky
    response = Net::HTTP.start(uri.host, uri.port, open_timeout: 5, read_timeout: 10) do |http|
      http.post(uri.path, "", headers)
    end
    raise DeliveryRefused if response.code == "409"
    raise "the ledger answered #{response.code}" unless response.code.start_with?("2")
  end
end

# In a server these blocks run at once, so after the classes.
Sidekiq.configure_server do |config|
  config.redis = { url: REDIS_URL }
  # Move due scheduled jobs and retries about every second (Sidekiq's
  # default: every 5 s per process). One setter in Sidekiq 6, 7 and 8.
  config.average_scheduled_poll_interval = 1
end
Qbridge::Sidekiq.report_outcomes! if ENV["QBRIDGE_OUTCOMES"] # qbridge: the fleet reports

if $PROGRAM_NAME == __FILE__
  # Each jid as it is pushed: a producer cut short still names its jobs.
  $stdout.sync = true
  case ARGV[0]
  when "produce" then ARGV.fetch(1, "10").to_i.times { |i| puts WelcomeEmail.perform_async(i) }
  when "schedule" then ARGV.fetch(1).to_i.times { |i| puts WelcomeEmail.perform_in(ARGV.fetch(2).to_f, i) }
  else abort "usage: ruby sidekiq_app.rb produce N | schedule N SECONDS"
  end
end
