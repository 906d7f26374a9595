# frozen_string_literal: true

# Whether a failure is a job's last, by the rules of the Sidekiq that runs
# it (its JobRetry), for Sidekiq 6, 7 and 8. Each rule below names the
# versions it follows; nothing here calls an API one of them lacks.
require "sidekiq"

module Qbridge
  module Sidekiq
    # The retries Sidekiq gives a job with retry: true unless configured.
    DEFAULT_MAX_RETRIES = 25

    # The running Sidekiq's version, for the rules that changed between
    # versions without a method to tell them apart.
    def self.version
      @version ||= Gem::Version.new(::Sidekiq::VERSION)
    end

    # The configured max retries, where this Sidekiq keeps it: 7 and 8 in
    # Sidekiq.default_configuration (JobRetry reads it there for every
    # capsule), 6.5 in Sidekiq[...], 6.0-6.4 in Sidekiq.options (gone in 7).
    def self.max_retries
      value = if ::Sidekiq.respond_to?(:default_configuration) then ::Sidekiq.default_configuration[:max_retries]
              elsif ::Sidekiq.respond_to?(:[]) then ::Sidekiq[:max_retries]
              else ::Sidekiq.options[:max_retries]
              end
      value || DEFAULT_MAX_RETRIES
    end

    # Whether this failure is the job's last, by Sidekiq's JobRetry, judged
    # before Sidekiq handles it (the middleware runs inside JobRetry):
    # - the job's retry option (its worker class's when the job has none;
    #   true when neither says): false is final; an Integer is the max,
    #   true the configured max_retries (25 by default); failures are
    #   numbered 0, 1, … (retry_count) and retried while below the max;
    # - retry_for (7.2 and later): final once the first failure (failed_at,
    #   now for the first) is more than retry_for seconds ago; from 8.1 on,
    #   a job with retry_for is judged by it alone;
    # - sidekiq_retry_in answering :kill or :discard (6.5.2 and later): final.
    # `error` is the exception (for sidekiq_retry_in), `now` a Time.
    def self.final_failure?(job, klass = nil, error: nil, now: Time.now)
      retry_opt = job["retry"]
      retry_opt = klass.get_sidekiq_options["retry"] if retry_opt.nil? && klass.respond_to?(:get_sidekiq_options)
      retry_opt = true if retry_opt.nil?
      return true if retry_opt == false

      count = job["retry_count"].nil? ? 0 : job["retry_count"].to_i + 1
      by_count = count >= (retry_opt.is_a?(Integer) ? retry_opt : max_retries)
      rf = version >= Gem::Version.new("7.2") ? job["retry_for"] : nil
      if rf
        by_time = (job_time(job["failed_at"]) || now.to_f) + rf.to_f < now.to_f
        return by_time if by_time || version >= Gem::Version.new("8.1")
      end
      by_count || given_up_by_retry_in?(job, klass, count, error)
    end

    # A job time (failed_at, retried_at, created_at, enqueued_at) in float
    # seconds since the epoch, or nil. Sidekiq 8 writes integer
    # milliseconds and reads a Float as seconds (a job written before an
    # upgrade may hold both); Sidekiq 6 and 7 write and compare float seconds.
    def self.job_time(value, integer_ms: version >= Gem::Version.new("8"))
      case value
      when Float then value
      when Integer then integer_ms ? value / 1000.0 : value.to_f
      end
    end

    # Whether the job's sidekiq_retry_in block answers :kill or :discard for
    # this failure (Sidekiq 7 and 8 ask the ActiveJob class a wrapper job
    # names before the worker's own). A block that raises is Sidekiq's
    # default backoff: not final.
    def self.given_up_by_retry_in?(job, klass, count, error)
      return false if version < Gem::Version.new("6.5.2")

      source = klass
      if version >= Gem::Version.new("7") && job["wrapped"]
        wrapped = Object.const_get(job["wrapped"]) rescue nil # rubocop:disable Style/RescueModifier
        source = wrapped
      end
      block = source.respond_to?(:sidekiq_retry_in_block) ? source.sidekiq_retry_in_block : nil
      return false unless block

      %i[kill discard].include?(block.call(count, error, job))
    rescue StandardError
      false
    end
  end
end
