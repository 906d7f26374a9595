# frozen_string_literal: true

# Workers for the runner's tests (loaded by the tests and by the runner they
# start with -r): one class per shadow declaration and retry rule. Not the
# sample app (examples/fleets/sidekiq_app.rb, which the other tests run):
# these exist to cover every declaration, including the refusals an app
# would not ship.
require "sidekiq"

class RbtFlaky < StandardError; end

class RbtAdd
  include Sidekiq::Job
  sidekiq_options retry: 2, qbridge_shadow: "dry_run"
  CALLS = [] # rubocop:disable Style/MutableConstant

  def perform(a, b)
    CALLS << [jid, a, b]
    { "sum" => a + b }
  end

  def perform_shadow(a, b)
    { "sum" => a + b }
  end
end

class RbtFailing
  include Sidekiq::Job
  sidekiq_options retry: 2

  def perform
    raise RbtFlaky
  end
end

class RbtSkip
  include Sidekiq::Job
  sidekiq_options qbridge_shadow: "skip"

  def perform; end
end

class RbtNoDryRun
  include Sidekiq::Job
  sidekiq_options qbridge_shadow: "dry_run"

  def perform; end
end
