# A Sidekiq 6 application moving to qbridge. Three lines are qbridge's (marked);
# the worker is the team's code, unchanged except its shadow declaration.
#
#   fleet:   QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=emails \
#            sidekiq -r ./examples/fleets/sidekiq_app.rb -q emails
#   runner:  adapters/ruby/bin/qbridge-sidekiq-runner -r ./examples/fleets/sidekiq_app.rb --listen 127.0.0.1:8091
#   produce: REDIS_URL=redis://127.0.0.1:6380 ruby examples/fleets/sidekiq_app.rb 10
require "sidekiq"
$LOAD_PATH.unshift(File.expand_path("../../adapters/ruby/lib", __dir__)) # qbridge
require "qbridge/sidekiq"                                                 # qbridge

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379") } }
Sidekiq.configure_server { |c| c.redis = { url: ENV.fetch("REDIS_URL", "redis://127.0.0.1:6379") } }

class WelcomeEmail
  include Sidekiq::Worker
  # In shadow, qbridge's runner calls perform_shadow: the same answer, no email.
  sidekiq_options queue: "emails", qbridge_shadow: "dry_run"

  def perform(user_id)
    # deliver the email here (the side effect)
    { "user" => user_id, "template" => "welcome" }
  end

  def perform_shadow(user_id)
    { "user" => user_id, "template" => "welcome" }
  end
end

Qbridge::Sidekiq.report_outcomes! if ENV["QBRIDGE_OUTCOMES"] # qbridge: the fleet reports

if $PROGRAM_NAME == __FILE__
  ARGV.fetch(0, "10").to_i.times { |i| puts WelcomeEmail.perform_async(i) }
end
