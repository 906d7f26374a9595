# frozen_string_literal: true

module Qbridge
  # The Redis side does not run a job Postgres owns. After a rollback below
  # postgres_only, or a lowered flipped share, a producer's retry of a job
  # qbridge already stored live in Postgres reaches Redis again; the fleet
  # would run it a second time. qbridge copies the keys it holds live into
  # the route's qbridge:live:<route> sorted set; this server middleware asks
  # it (one ZSCORE) before the job runs, and a job found there is reported
  # as skipped and not run (Sidekiq removes it from the queue as done).
  #
  # When Redis cannot answer, the error is raised: Sidekiq retries the job
  # later, and it is asked again then. Running it without the answer would
  # act on silence.
  class LiveGuard
    # Positional: Sidekiq 6's middleware chain passes arguments without
    # keywords.
    def initialize(settings, reporter, redis, logger)
      @key = settings.live_key
      @reporter = reporter
      @redis = redis
      @logger = logger
      @skipped = 0
    end

    attr_reader :skipped

    # Whether Postgres holds job key +key+ live.
    def owned?(key)
      !@redis.call { |conn| conn.zscore(@key, key) }.nil?
    end

    # Sidekiq's server middleware interface.
    def call(_worker, job, _queue)
      jid = job["jid"]
      if jid && owned?(jid)
        @skipped += 1
        @reporter.report(jid, "skipped")
        @logger.info("qbridge: skipped a re-push of a job Postgres runs live (#{@skipped} so far)")
        return nil
      end
      yield
    end
  end
end
