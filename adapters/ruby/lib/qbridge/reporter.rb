# frozen_string_literal: true

# One path for every outcome a fleet reports: batched, bounded, and never in
# the way of the job. #report only appends to a bounded queue (no I/O in the
# job's thread); a background thread sends batches over HTTP
# (POST /v1/outcomes, one transaction per batch) or SQL
# (qbridge.report_outcome, needs the pg gem), retrying a few times. The keys
# of finished jobs (ok or dead) whose outcome cannot be delivered are added
# to the route's qbridge:ran:<route> set in Redis (the set qbridge's own consumer keeps), so the diff counts those jobs
# as run with an unknown outcome and repair never pushes them back. Only when
# Redis refuses that too is a report lost: counted and logged (counts, never
# keys or payloads).
require "json"
require "net/http"
require "uri"

module Qbridge
  OUTCOMES = %w[ok failed dead skipped].freeze
  # The outcomes that say a job ran to its end: only these go to the ran set
  # when they cannot be delivered (a failed attempt runs again; a skipped
  # job never ran).
  FINAL = %w[ok dead].freeze
  # A detail longer than this is not sent (the outcome is, without it): one
  # large result must not push a batch past the listener's body limit.
  MAX_DETAIL = 64 * 1024
  # Mirrors qbridge's RAN_RETENTION_MS.
  RAN_RETENTION_MS = 7 * 24 * 3600 * 1000

  # A setting is missing or malformed.
  class SettingsError < StandardError; end

  # The adapters' settings, one environment variable each (see README).
  Settings = Struct.new(:outcomes, :route, :queue, :token, keyword_init: true) do
    def self.from_env(env = ENV)
      outcomes = env.fetch("QBRIDGE_OUTCOMES", "").strip
      route = env.fetch("QBRIDGE_ROUTE", "").strip
      raise SettingsError, "QBRIDGE_OUTCOMES is not set: give qbridge's HTTP listener (http://host:port) or its database (postgres://...)" if outcomes.empty?
      raise SettingsError, "QBRIDGE_OUTCOMES must start with http://, https://, postgres:// or postgresql://" unless outcomes.match?(%r{\A(https?|postgres(ql)?)://})
      raise SettingsError, "QBRIDGE_ROUTE is not set: give the name of the route in qbridge.toml" if route.empty?
      queue = env.fetch("QBRIDGE_QUEUE", "").strip
      new(outcomes: outcomes, route: route, queue: queue.empty? ? route : queue, token: env["QBRIDGE_TOKEN"])
    end

    def over_sql?
      outcomes.match?(%r{\Apostgres(ql)?://})
    end

    def outcomes_url
      base = outcomes.chomp("/")
      base.end_with?("/v1/outcomes") ? base : "#{base}/v1/outcomes"
    end

    def ran_key
      "qbridge:ran:#{route}"
    end

    # The route's live-key guard: the job keys Postgres holds live.
    def live_key
      "qbridge:live:#{route}"
    end
  end

  # The text both sides' digests compare: compact JSON with sorted keys, or
  # nil when it cannot be written as JSON (NaN, invalid UTF-8): then there is
  # nothing to compare, and reporting still never fails.
  def self.canonical(value)
    JSON.generate(sorted(value))
  rescue JSON::GeneratorError, EncodingError
    nil
  end

  def self.sorted(value)
    case value
    when Hash then value.to_h { |k, v| [k.to_s, sorted(v)] }.sort.to_h
    when Array then value.map { |v| sorted(v) }
    when nil, true, false, Numeric, String then value
    else value.to_s
    end
  end

  # Sends the outcomes of one route. Thread-safe; one per process.
  class Reporter
    attr_reader :delivered, :recorded_unknown, :lost

    # redis: a callable yielding a Redis connection (Sidekiq.method(:redis)).
    def initialize(settings, redis:, logger:, capacity: 10_000, batch: 200, interval: 0.1, retries: 3, timeout: 5)
      @settings = settings
      @redis = redis
      @logger = logger
      @capacity = capacity
      @batch = batch
      @interval = interval
      @retries = retries
      @timeout = timeout
      @delivered = @recorded_unknown = @lost = 0
      @lock = Mutex.new
      start
    end

    # Queues one outcome; returns at once; never raises.
    def report(key, outcome, detail = nil)
      start if @pid != Process.pid # a forked child has the queue, not the thread
      return @logger.warn("qbridge: ignored an outcome that is not ok, failed, dead or skipped") unless OUTCOMES.include?(outcome) && key

      entry = { "queue" => @settings.queue, "key" => key.to_s, "outcome" => outcome }
      entry["detail"] = detail unless detail.nil? || detail.bytesize > MAX_DETAIL
      @lock.synchronize do
        if @buffer.size < @capacity then @buffer << entry
        elsif !FINAL.include?(outcome) then @lost += 1 # failed runs again; skipped never ran
        elsif @spilled.size < @capacity * 10 then @spilled << entry["key"]
        else @lost += 1
        end
      end
    rescue StandardError
      nil
    end

    # Sends what is buffered and waits for it, for up to deadline seconds.
    # What is still unsent then (qbridge unreachable) is recorded in the ran
    # set at once, so a process about to exit loses none of it silently.
    def flush(deadline = 5)
      stop_at = Process.clock_gettime(Process::CLOCK_MONOTONIC) + deadline
      sleep 0.02 while pending? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < stop_at
      return true unless pending?

      entries, spilled = @lock.synchronize do
        taken = [@buffer + @in_flight, @spilled.dup]
        @buffer.clear
        @spilled.clear
        taken
      end
      final = entries.select { |e| FINAL.include?(e["outcome"]) }.map { |e| e["key"] } + spilled
      @logger.warn("qbridge: #{final.size} outcomes unsent at the deadline; recording them as unknown")
      final.empty? || record_unknown(final)
    end

    def pending?
      @lock.synchronize { !@buffer.empty? || !@spilled.empty? || !@in_flight.empty? }
    end

    private

    def start
      @pid = Process.pid
      @buffer = []
      @spilled = []
      @in_flight = [] # the batch being sent
      @thread = Thread.new { loop { sleep @interval; drain } }
      @thread.name = "qbridge-reporter" if @thread.respond_to?(:name=)
      at_exit { flush(3) }
    end

    def drain
      loop do
        batch, spilled = @lock.synchronize do
          taken = [@buffer.shift(@batch), @spilled.shift(@batch * 10)]
          @in_flight = taken[0] + taken[1].map { |k| { "key" => k, "outcome" => "ok" } }
          taken
        end
        begin
          send_batch(batch, spilled)
        ensure
          @lock.synchronize { @in_flight = [] }
        end
        break if batch.empty? && spilled.empty?
      end
    rescue StandardError => e
      @logger.warn("qbridge: the reporter's pass failed (#{e.class}); it goes on")
    end

    def send_batch(batch, spilled)
      record_unknown(spilled) unless spilled.empty?
      return if batch.empty?

      if deliver(batch) then @delivered += batch.size
      else
        # Only a final outcome says the job ran to its end; a failed attempt
        # runs again and its final outcome is reported then; a skipped job
        # never ran (losing that report costs the diff a count, no more).
        final = batch.select { |e| FINAL.include?(e["outcome"]) }.map { |e| e["key"] }
        @lost += batch.size - final.size
        record_unknown(final) unless final.empty?
      end
    end

    def deliver(batch)
      @retries.times do |attempt|
        @settings.over_sql? ? send_sql(batch) : send_http(batch)
        return true
      rescue Refused => e
        @logger.warn("qbridge: outcomes refused (#{e.message}); recording them as unknown")
        return false
      rescue StandardError, LoadError => e
        if attempt + 1 < @retries then sleep(0.2 * (2**attempt))
        else @logger.warn("qbridge: cannot deliver #{batch.size} outcomes (#{e.class}); recording them as unknown")
        end
      end
      false
    end

    # A 4xx other than 408/429: sending it again cannot help.
    class Refused < StandardError; end

    def send_http(batch)
      uri = URI(@settings.outcomes_url)
      headers = { "content-type" => "application/json" }
      headers["authorization"] = "Bearer #{@settings.token}" if @settings.token
      response = Net::HTTP.start(uri.host, uri.port, use_ssl: uri.scheme == "https",
                                                     open_timeout: @timeout, read_timeout: @timeout) do |http|
        http.post(uri.path, JSON.generate(batch), headers)
      end
      code = response.code.to_i
      return if code.between?(200, 299)
      raise Refused, code.to_s if code.between?(400, 499) && ![408, 429].include?(code)

      raise "HTTP #{code}"
    end

    def send_sql(batch)
      require "pg"
      @sql ||= PG.connect(@settings.outcomes, connect_timeout: [@timeout.to_i, 1].max)
      @sql.transaction do |tx|
        batch.each do |e|
          tx.exec_params("SELECT qbridge.report_outcome($1, $2, $3, $4)", [e["queue"], e["key"], e["outcome"], e["detail"]])
        end
      end
    rescue StandardError
      @sql&.close
      @sql = nil
      raise
    end

    def record_unknown(keys)
      now = (Time.now.to_f * 1000).to_i
      @redis.call do |conn|
        # Flat score, member, … pairs: what redis-rb (Sidekiq 6) and
        # redis-client (Sidekiq 7 and 8, which refuses nested arrays) both take.
        conn.zadd(@settings.ran_key, keys.flat_map { |k| [now, k] })
        conn.zremrangebyscore(@settings.ran_key, "-inf", now - RAN_RETENTION_MS)
      end
      @recorded_unknown += keys.size
      true
    rescue StandardError => e
      @lost += keys.size
      @logger.warn("qbridge: could not record #{keys.size} undelivered outcomes in Redis either (#{e.class})")
      false
    end
  end
end
