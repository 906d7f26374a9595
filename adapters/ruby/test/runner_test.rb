# frozen_string_literal: true

# The Sidekiq runner's answers as qbridge's handler, in process and over
# HTTP (keep-alive, as qbridge's client uses it).
require "minitest/autorun"
require "net/http"
require "open3"
require "qbridge/sidekiq_runner"

require_relative "workers"

class RunnerTest < Minitest::Test
  def job(klass, args = [], retry_opt: 2)
    JSON.generate({ "class" => klass, "args" => args, "jid" => "j-1", "retry" => retry_opt, "queue" => "q" })
  end

  def run_job(body, mode = "live", attempt = 1)
    Qbridge::Sidekiq::Runner.run(body, mode, attempt)
  end

  def test_a_job_runs_its_workers_perform_with_its_jid
    RbtAdd::CALLS.clear
    assert_equal [200, '{"sum":5}'], run_job(job("RbtAdd", [2, 3]))
    assert_equal [["j-1", 2, 3]], RbtAdd::CALLS
  end

  def test_retries_follow_the_jobs_retry_option_then_fail_for_good
    assert_equal [503, "RbtFlaky"], run_job(job("RbtFailing"), "live", 1)
    assert_equal [503, "RbtFlaky"], run_job(job("RbtFailing"), "live", 2)
    assert_equal [422, "RbtFlaky"], run_job(job("RbtFailing"), "live", 3)
    assert_equal [422, "RbtFlaky"], run_job(job("RbtFailing", retry_opt: false))
  end

  def test_shadow_runs_only_what_the_class_declares
    RbtAdd::CALLS.clear
    assert_equal [200, '{"sum":5}'], run_job(job("RbtAdd", [2, 3]), "shadow")
    assert_equal [204, ""], run_job(job("RbtSkip"), "shadow")
    status, body = run_job(job("RbtFailing"), "shadow")
    assert_equal 422, status
    assert_match(/refuses shadow/, body)
    assert_empty RbtAdd::CALLS
    status, body = run_job(job("RbtNoDryRun"), "shadow")
    assert_equal 422, status
    assert_match(/no perform_shadow/, body)
    assert_equal 400, run_job(job("RbtAdd", [1, 1]), "replay").first
  end

  # A wrapper job (ActiveJob's, in a Rails app) takes its shadow declaration
  # from the class it wraps, as Sidekiq's client merges their options.
  def test_a_wrapper_job_follows_the_wrapped_class_in_shadow
    body = JSON.generate({ "class" => "RbtFailing", "wrapped" => "RbtSkip", "args" => [], "jid" => "j-2" })
    assert_equal [204, ""], run_job(body, "shadow")
    body = JSON.generate({ "class" => "RbtFailing", "wrapped" => "NoSuchJob", "args" => [], "jid" => "j-3" })
    assert_equal 422, run_job(body, "shadow").first
  end

  def test_bad_jobs_fail_for_good
    assert_equal 422, run_job(job("NoSuchWorker")).first
    assert_equal 422, run_job("not json").first
    assert_equal 422, run_job("[1]").first
  end

  def test_the_command_form_answers_with_its_exit_code
    bin = File.expand_path("../bin/qbridge-sidekiq-runner", __dir__)
    command = lambda do |body, attempt|
      out, _err, status = Open3.capture3({ "QBRIDGE_MODE" => "live", "QBRIDGE_ATTEMPT" => attempt.to_s },
                                         "ruby", bin, "-r", File.expand_path("workers.rb", __dir__), "--command", stdin_data: body)
      [status.exitstatus, out]
    end
    assert_equal [0, '{"sum":3}'], command.call(job("RbtAdd", [1, 2]), 1)
    assert_equal 75, command.call(job("RbtFailing"), 1).first
    assert_equal 65, command.call(job("RbtFailing"), 3).first
  end

  def test_over_http_on_one_connection
    server = TCPServer.new("127.0.0.1", 0)
    port = server.addr[1]
    server.close
    thread = Thread.new { Qbridge::Sidekiq::Runner.serve("127.0.0.1", port, out: StringIO.new) }
    sleep 0.3
    Net::HTTP.start("127.0.0.1", port) do |http|
      ok = http.post("/", job("RbtAdd", [1, 1]), "qbridge-mode" => "live", "qbridge-attempt" => "1")
      assert_equal ["200", '{"sum":2}'], [ok.code, ok.body]
      skip_answer = http.post("/", job("RbtSkip"), "qbridge-mode" => "shadow")
      assert_equal "204", skip_answer.code
      retry_answer = http.post("/", job("RbtFailing"), "qbridge-mode" => "live", "qbridge-attempt" => "1")
      assert_equal "503", retry_answer.code
    end
    TCPSocket.open("127.0.0.1", port) do |sock|
      sock.write("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
      assert_match(/\AHTTP\/1.1 411/, sock.gets)
    end
  ensure
    thread&.kill
  end
end
