# Schedules jobs with Sidekiq's own client (6.4, Debian's ruby-sidekiq)
# through qbridge's proxy at REDIS_URL, then runs Sidekiq's own scheduler
# pass (Sidekiq::Scheduled::Enq, what a Sidekiq server's poller runs) once
# the short one is due, so it moves that job from `schedule` to its queue's
# list through the proxy as well:
#   - 3 jobs of queue "default" due in an hour (perform_in),
#   - 1 job of queue "other" due in an hour,
#   - 1 job of "default" due in a second, moved to queue:default.
# Prints "later <jid>" for the first three, "other <jid>", "moved <jid>".
require "sidekiq"
require "sidekiq/scheduled"

# The sample app (examples/fleets/sidekiq_app.rb) on queue "default": its
# client and its worker class, WelcomeEmail.
ENV["SIDEKIQ_QUEUE"] = "default"
require_relative "../../examples/fleets/sidekiq_app"

3.times { |i| puts "later #{WelcomeEmail.perform_in(3600, i)}" }
puts "other #{WelcomeEmail.set(queue: "other").perform_in(3600, 9)}"
moved = WelcomeEmail.perform_in(1, 42)
sleep 1.5
Sidekiq::Scheduled::Enq.new.enqueue_jobs
puts "moved #{moved}"
