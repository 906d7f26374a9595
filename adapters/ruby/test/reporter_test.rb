# frozen_string_literal: true

# The Sidekiq adapter's reporter and middleware against a real HTTP listener,
# a real Redis (Sidekiq's own connection) and a real qbridge schema. Run by
# the Rust suite (tests/it/fleet_adapters.rs), which gives
# QBRIDGE_TEST_DATABASE_URL (a migrated database) and QBRIDGE_TEST_REDIS_URL.
require "minitest/autorun"
require "securerandom"
require "socket"
require "qbridge/sidekiq"

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("QBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379") } }
Sidekiq.logger.level = Logger::ERROR

# A stand-in for qbridge's HTTP listener that records each POST.
class Listener
  attr_reader :requests, :url

  def initialize(status: 201)
    @requests = Queue.new
    @server = TCPServer.new("127.0.0.1", 0)
    @url = "http://127.0.0.1:#{@server.addr[1]}"
    @thread = Thread.new do
      loop do
        client = @server.accept
        headers = {}
        client.gets
        while (line = client.gets) && line != "\r\n"
          name, value = line.split(":", 2)
          headers[name.downcase] = value.strip
        end
        @requests << [headers, JSON.parse(client.read(headers["content-length"].to_i))]
        client.write("HTTP/1.1 #{status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
        client.close
      end
    end
  end

  def all
    out = []
    out << @requests.pop until @requests.empty?
    out
  end

  def close
    @thread.kill
    @server.close
  end
end

class ReporterTest < Minitest::Test
  def settings(outcomes, token: nil)
    route = "rbt#{SecureRandom.hex(5)}"
    Qbridge::Settings.new(outcomes: outcomes, route: route, queue: route, token: token)
  end

  def reporter(settings, **opts)
    Qbridge::Reporter.new(settings, redis: Sidekiq.method(:redis), logger: Sidekiq.logger, **opts)
  end

  def ran(settings)
    Sidekiq.redis { |c| c.zrange(settings.ran_key, 0, -1) }.sort
  end

  def test_outcomes_go_in_batches_with_the_token
    listener = Listener.new
    s = settings(listener.url, token: "s3cret")
    r = reporter(s, batch: 100, interval: 0.05)
    250.times { |i| r.report("k#{i}", "ok", '{"n":1}') }
    assert r.flush(10)
    requests = listener.all
    listener.close
    sent = requests.flat_map { |_, batch| batch }
    assert_equal((0...250).map { |i| "k#{i}" }, sent.map { |e| e["key"] })
    assert(requests.all? { |_, batch| batch.size <= 100 })
    assert(requests.all? { |h, _| h["authorization"] == "Bearer s3cret" })
    assert_equal({ "queue" => s.queue, "key" => "k0", "outcome" => "ok", "detail" => '{"n":1}' }, sent.first)
    assert_equal 250, r.delivered
  end

  def test_undeliverable_outcomes_are_recorded_as_run_but_failed_attempts_are_not
    s = settings("http://127.0.0.1:9") # nothing listens: qbridge is down
    r = reporter(s, interval: 0.01, retries: 2)
    r.report("done-1", "ok", "{}")
    r.report("gave-up-1", "dead", "Boom")
    r.report("will-retry-1", "failed", "Boom")
    r.report("never-ran-1", "skipped")
    assert r.flush(10)
    assert_equal %w[done-1 gave-up-1], ran(s)
    assert_equal 2, r.recorded_unknown
  end

  def test_the_live_guard_skips_a_job_postgres_owns_and_reports_it
    listener = Listener.new
    s = settings(listener.url)
    r = reporter(s, interval: 0.01)
    guard = Qbridge::LiveGuard.new(s, r, Sidekiq.method(:redis), Sidekiq.logger)
    Sidekiq.redis { |c| c.zadd(s.live_key, [1, "owned-1"]) }
    ran_jobs = []
    guard.call(nil, { "jid" => "owned-1" }, "q") { ran_jobs << "owned-1" }
    guard.call(nil, { "jid" => "fresh-1" }, "q") { ran_jobs << "fresh-1" }
    assert_equal %w[fresh-1], ran_jobs
    assert r.flush(5)
    sent = listener.all.flat_map { |_, batch| batch }
    listener.close
    assert_equal [{ "queue" => s.queue, "key" => "owned-1", "outcome" => "skipped" }], sent
    assert_equal 1, guard.skipped
  ensure
    Sidekiq.redis { |c| c.del(s.live_key) }
  end

  def test_a_refused_batch_is_recorded_at_once_without_retries
    listener = Listener.new(status: 401)
    s = settings(listener.url)
    r = reporter(s, interval: 0.01, retries: 5)
    r.report("k1", "ok")
    assert r.flush(5)
    assert_equal 1, listener.all.size
    listener.close
    assert_equal %w[k1], ran(s)
  end

  def test_reporting_never_waits
    s = settings("http://10.255.255.1:9") # unroutable: every send hangs until its timeout
    r = reporter(s, interval: 0.01)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    1000.times { |i| r.report("k#{i}", "ok") }
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 0.5
  end

  def test_outcomes_over_sql_land_in_qbridges_table
    url = ENV.fetch("QBRIDGE_TEST_DATABASE_URL") { flunk "set QBRIDGE_TEST_DATABASE_URL to a database qbridge migrated" }
    s = settings(url)
    r = reporter(s, interval: 0.01)
    r.report("sql-1", "ok", '{"n":1}')
    r.report("sql-2", "dead", "Boom")
    assert r.flush(10)
    rows = PG.connect(url).exec_params(
      "SELECT key, outcome, side FROM qbridge.outcomes WHERE queue = $1 ORDER BY key", [s.queue]
    ).values
    assert_equal [%w[sql-1 ok redis], %w[sql-2 dead redis]], rows
    assert_equal 2, r.delivered
  end

  # Producers and qbridge-sidekiq-runner load the fleet's file too: outside
  # a Sidekiq server report_outcomes! reads no settings and adds nothing.
  def test_a_process_that_is_not_a_sidekiq_server_needs_no_settings
    lib = File.expand_path("../lib", __dir__)
    env = ENV.to_h.reject { |k, _| k.start_with?("QBRIDGE_") }
    script = 'require "qbridge/sidekiq"; p Qbridge::Sidekiq.report_outcomes!'
    out = IO.popen([env, RbConfig.ruby, "-I", lib, "-e", script, err: %i[child out]], unsetenv_others: true, &:read)
    assert $?.success?, out
    assert_equal "nil", out.strip
  end

  def test_missing_settings_name_the_variable
    err = assert_raises(Qbridge::SettingsError) { Qbridge::Settings.from_env("QBRIDGE_ROUTE" => "r") }
    assert_match(/QBRIDGE_OUTCOMES is not set/, err.message)
    err = assert_raises(Qbridge::SettingsError) { Qbridge::Settings.from_env("QBRIDGE_OUTCOMES" => "http://q") }
    assert_match(/QBRIDGE_ROUTE is not set/, err.message)
    s = Qbridge::Settings.from_env("QBRIDGE_OUTCOMES" => "http://q:8080/", "QBRIDGE_ROUTE" => "emails")
    assert_equal ["http://q:8080/v1/outcomes", "emails", "qbridge:ran:emails"], [s.outcomes_url, s.queue, s.ran_key]
  end
end

# A reporter that only records what it was given.
class Recorded
  attr_reader :reports

  def initialize
    @reports = []
  end

  def report(*args)
    @reports << args
  end
end

class MiddlewareTest < Minitest::Test
  class Plain
    include Sidekiq::Job
  end

  def call(job, &block)
    recorded = Recorded.new
    begin
      Qbridge::Sidekiq::ReportOutcome.new(recorded).call(Plain.new, job, "q", &block)
    rescue Exception # rubocop:disable Lint/RescueException
      nil
    end
    recorded.reports
  end

  def test_outcomes_by_sidekiqs_rules
    assert_equal [["j", "ok", '{"a":false,"b":1}']], call("jid" => "j") { { b: 1, a: false } }
    assert_equal [%w[j failed RuntimeError]], call("jid" => "j", "retry" => 3) { raise "x" }
    assert_equal [%w[j dead RuntimeError]], call("jid" => "j", "retry" => false) { raise "x" }
    # No retry option in the job: the worker class's (Sidekiq's default: retry).
    assert_equal [%w[j failed RuntimeError]], call("jid" => "j") { raise "x" }
  end

  def test_a_shutdown_is_not_a_failure
    assert_empty(call("jid" => "j", "retry" => false) { raise ::Sidekiq::Shutdown })
  end

  def test_a_result_json_cannot_hold_is_reported_without_a_detail
    assert_equal [["j", "ok", nil]], call("jid" => "j") { Float::NAN }
  end
end

class FinalFailureTest < Minitest::Test
  S = Qbridge::Sidekiq

  # Gives up on every failure, the way Sidekiq 6.5.2 and later read it.
  class Killed
    include Sidekiq::Job
    sidekiq_retry_in { |_count, error| error.is_a?(ArgumentError) ? :kill : 5 }
  end

  # The configured max_retries, set where this Sidekiq keeps it.
  def with_max_retries(value)
    config = Sidekiq.respond_to?(:default_configuration) ? Sidekiq.default_configuration : Sidekiq.options
    before = config[:max_retries]
    config[:max_retries] = value
    yield
  ensure
    config[:max_retries] = before
  end

  # Sidekiq's JobRetry: failures numbered 0, 1, … retried while below max.
  def test_a_failure_is_final_when_sidekiq_would_not_retry_it
    refute S.final_failure?({ "retry" => 3 })
    refute S.final_failure?({ "retry" => 3, "retry_count" => 1 })
    assert S.final_failure?({ "retry" => 3, "retry_count" => 2 })
    assert S.final_failure?({ "retry" => false })
    assert S.final_failure?({ "retry" => 0 })
    refute S.final_failure?({ "retry" => true, "retry_count" => 23 })
    assert S.final_failure?({ "retry" => true, "retry_count" => 24 })
  end

  def test_the_default_max_comes_from_this_sidekiqs_configuration
    assert_equal 25, S.max_retries
    with_max_retries(2) do
      refute S.final_failure?({ "retry" => true })
      assert S.final_failure?({ "retry" => true, "retry_count" => 1 })
    end
  end

  # From Sidekiq 6.5.2 (not in 6.4, which takes any answer as a delay).
  def test_retry_in_answering_kill_is_final
    refute S.final_failure?({ "retry" => true }, Killed, error: RuntimeError.new)
    assert_equal S.version >= Gem::Version.new("6.5.2"),
                 S.final_failure?({ "retry" => true }, Killed, error: ArgumentError.new)
  end

  # retry_for (Sidekiq 7.2 and later): final once the first failure is
  # older than it; the first failure itself never is. Sidekiq 6.4 has no
  # retry_for: there the count alone decides.
  def test_retry_for_counts_from_the_first_failure
    now = Time.now
    job = { "retry" => true, "retry_for" => 60 }
    refute S.final_failure?(job, now: now)
    refute S.final_failure?(job.merge("retry_count" => 0, "failed_at" => now.to_f - 30), now: now)
    assert_equal S.version >= Gem::Version.new("7.2"),
                 S.final_failure?(job.merge("retry_count" => 0, "failed_at" => now.to_f - 90), now: now)
  end

  # Sidekiq 8 (which needs Ruby 3.2, so its rules are run here under its
  # version number, written after lib/sidekiq/job_retry.rb at v8.0.8 and
  # v8.1.7): failed_at in integer milliseconds or, from a job first failed
  # before the upgrade, float seconds; from 8.1 retry_for alone decides.
  def test_sidekiq_8s_rules
    real = S.version
    now = Time.now
    ms = (now.to_f * 1000).to_i
    S.instance_variable_set(:@version, Gem::Version.new("8.0.8"))
    job = { "retry" => 2, "retry_for" => 60, "retry_count" => 0 }
    assert S.final_failure?(job.merge("failed_at" => ms - 90_000), now: now)
    refute S.final_failure?(job.merge("failed_at" => ms - 30_000), now: now)
    assert S.final_failure?(job.merge("failed_at" => now.to_f - 90), now: now)
    assert S.final_failure?(job.merge("failed_at" => ms - 30_000, "retry_count" => 1), now: now), "8.0: the count too"
    S.instance_variable_set(:@version, Gem::Version.new("8.1.7"))
    refute S.final_failure?(job.merge("failed_at" => ms - 30_000, "retry_count" => 1), now: now), "8.1: retry_for alone"
    assert S.final_failure?(job.merge("failed_at" => ms - 90_000, "retry_count" => 1), now: now)
  ensure
    S.instance_variable_set(:@version, real)
  end

  # Sidekiq 8 writes job times in integer milliseconds and still reads a
  # Float as seconds (one job may hold both across an upgrade); 6 and 7
  # read every number as seconds.
  def test_job_times_in_either_unit
    assert_in_delta 1_764_000_000.123, S.job_time(1_764_000_000_123, integer_ms: true), 1e-6
    assert_in_delta 1_764_000_000.5, S.job_time(1_764_000_000.5, integer_ms: true), 1e-6
    assert_in_delta 1_764_000_000_123.0, S.job_time(1_764_000_000_123, integer_ms: false), 1e-6
    assert_nil S.job_time(nil)
    assert_nil S.job_time("2026-11-28")
  end
end
