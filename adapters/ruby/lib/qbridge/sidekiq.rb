# frozen_string_literal: true

# Sidekiq (6, 7 and 8): the fleet's outcome reporter and the Postgres side's job
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
# Before it, Qbridge::LiveGuard skips a job whose jid Postgres holds live (a
# re-push after a rollback or a lowered share) and reports it as skipped.
#
# Shadow behaviour (what the runner does when qbridge calls in shadow mode),
# per worker class: sidekiq_options qbridge_shadow: "refuse" (the default),
# "skip", or "dry_run" (calls the worker's perform_shadow(*args), which must
# not have side effects; its return value is compared with the fleet's).
require "sidekiq"
require_relative "live_guard"
require_relative "reporter"
require_relative "sidekiq_retry"
require_relative "version"

module Qbridge
  module Sidekiq
    # Only a Sidekiq server reports, and only it reads the settings
    # (QBRIDGE_*): Sidekiq runs configure_server's block in the server alone,
    # so producers and qbridge-sidekiq-runner, which load the same file,
    # need none. A server without them fails at its start, naming the
    # variable. Returns the reporter in a server, nil elsewhere.
    def self.report_outcomes!(settings = nil)
      reporter = nil
      # Sidekiq 7 and 8: each capsule copies this chain when it first runs a
      # job (after boot), so one reporter added here covers every capsule.
      ::Sidekiq.configure_server do |config|
        settings ||= Settings.from_env
        reporter = Reporter.new(settings, redis: ::Sidekiq.method(:redis), logger: ::Sidekiq.logger)
        config.server_middleware do |chain|
          # The guard first: a job it skips never reaches the reporter's
          # middleware, so it is reported as skipped, not as ok.
          chain.add(LiveGuard, settings, reporter, ::Sidekiq.method(:redis), ::Sidekiq.logger)
          chain.add(ReportOutcome, reporter)
        end
        config.on(:shutdown) { reporter.flush(5) }
      end
      reporter
    end

    # Whether Sidekiq is shutting the job down (it goes back to the queue:
    # not a failure, as Sidekiq's own JobRetry says).
    def self.shutdown?(error)
      seen = 0
      while error && seen < 16
        return true if error.is_a?(::Sidekiq::Shutdown)

        error = error.cause
        seen += 1
      end
      false
    end

    # The server middleware: reports after the job ran (or raised). A report
    # never changes what the job did: its own errors are logged, never raised.
    class ReportOutcome
      def initialize(reporter)
        @reporter = reporter
      end

      def call(worker, job, _queue)
        begin
          result = yield
        rescue Exception => e # rubocop:disable Lint/RescueException - reported, then raised again
          failed(worker, job, e) unless Sidekiq.shutdown?(e)
          raise
        end
        report(job["jid"], "ok", Qbridge.canonical(result))
        result
      end

      private

      def failed(worker, job, error)
        final = Sidekiq.final_failure?(job, worker.class, error: error)
        report(job["jid"], final ? "dead" : "failed", error.class.name)
      rescue StandardError
        nil
      end

      def report(jid, outcome, detail)
        @reporter.report(jid, outcome, detail)
      rescue StandardError
        nil
      end
    end
  end
end
