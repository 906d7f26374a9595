# Puts jobs into Sidekiq's own structures with Sidekiq's own code (6.4, the
# Debian package ruby-sidekiq), against the Redis at REDIS_URL:
#   - 3 jobs of queue "default" and 1 of queue "other" in `schedule`
#     (perform_in),
#   - 2 jobs of "default" in the list queue:default (perform_async),
#   - 1 job of "default" in `retry` (Sidekiq's retry handler, after a failure),
#   - 1 job of "default" in `dead` (Sidekiq::DeadSet#kill).
# Prints nothing; exits non-zero on any error.
require "sidekiq"
require "sidekiq/api"
require "sidekiq/job_retry"

# The sample app (examples/fleets/sidekiq_app.rb) on queue "default": its
# client and its worker class, WelcomeEmail.
ENV["SIDEKIQ_QUEUE"] = "default"
require_relative "../../examples/fleets/sidekiq_app"

3.times { |i| WelcomeEmail.perform_in(3600, i) }
WelcomeEmail.set(queue: "other").perform_in(60, 9)
2.times { |i| WelcomeEmail.perform_async(i) }

now = Time.now.to_f
failed = Sidekiq.dump_json(
  "class" => "WelcomeEmail", "args" => [7], "queue" => "default", "jid" => "retry-jid",
  "retry" => true, "created_at" => now, "enqueued_at" => now
)
begin
  Sidekiq::JobRetry.new.global(failed, "default") { raise "boom" }
rescue Sidekiq::JobRetry::Handled
  # The job is in the retry set; the handler says so by raising.
end

dead = Sidekiq.dump_json("class" => "WelcomeEmail", "args" => [8], "queue" => "default", "jid" => "dead-jid")
Sidekiq::DeadSet.new.kill(dead, notify_failure: false)
