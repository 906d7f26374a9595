# frozen_string_literal: true

# Sidekiq (6.x): the fleet's outcome reporter and the Postgres side's job
# runner (Qbridge::Sidekiq::Runner, in qbridge/sidekiq_runner).
#
# Fleet side, in the file the workers load (sidekiq -r):
#
#   require "qbridge/sidekiq"
#   Qbridge::Sidekiq.report_outcomes!     # settings from QBRIDGE_* (README)
#
# A server middleware reports each job by its jid (qbridge's key for the
# sidekiq format): ok (detail: perform's return value, Qbridge.canonical),
# failed (Sidekiq will retry it), dead (no retry left, or retry: false).
#
# Shadow behaviour (what the runner does when qbridge calls in shadow mode),
# per worker class: sidekiq_options qbridge_shadow: "refuse" (the default),
# "skip", or "dry_run" (calls the worker's perform_shadow(*args), which must
# not have side effects; its return value is compared with the fleet's).
require "sidekiq"
require_relative "reporter"

module Qbridge
  module Sidekiq
    # The retries Sidekiq gives a job with retry: true.
    DEFAULT_MAX_RETRIES = 25

    def self.report_outcomes!(settings = Settings.from_env)
      reporter = Reporter.new(settings, redis: ::Sidekiq.method(:redis), logger: ::Sidekiq.logger)
      ::Sidekiq.configure_server do |config|
        config.server_middleware { |chain| chain.add(ReportOutcome, reporter) }
        config.on(:shutdown) { reporter.flush(5) }
      end
      reporter
    end

    # Whether this failure is the job's last: Sidekiq's JobRetry numbers a
    # job's failures 0, 1, … (retry_count) and retries while that number is
    # below the job's max.
    def self.final_failure?(job)
      retry_opt = job["retry"]
      return true if retry_opt == false || retry_opt.nil?

      max = retry_opt.is_a?(Integer) ? retry_opt : DEFAULT_MAX_RETRIES
      count = job["retry_count"].nil? ? 0 : job["retry_count"].to_i + 1
      count >= max
    end

    # The server middleware: reports after the job ran (or raised).
    class ReportOutcome
      def initialize(reporter)
        @reporter = reporter
      end

      def call(_worker, job, _queue)
        result = yield
        @reporter.report(job["jid"], "ok", Qbridge.canonical(result))
        result
      rescue Exception => e # rubocop:disable Lint/RescueException - reported, then raised again
        @reporter.report(job["jid"], Sidekiq.final_failure?(job) ? "dead" : "failed", e.class.name)
        raise
      end
    end
  end
end
