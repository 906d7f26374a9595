# frozen_string_literal: true

# The team's workers, as the runner tests see them (loaded by the tests and
# by the runner they start with -r): every shadow declaration and retry rule.
require "sidekiq"

class RbtFlaky < StandardError; end

class RbtAdd
  include Sidekiq::Worker
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
  include Sidekiq::Worker
  sidekiq_options retry: 2

  def perform
    raise RbtFlaky
  end
end

class RbtSkip
  include Sidekiq::Worker
  sidekiq_options qbridge_shadow: "skip"

  def perform; end
end

class RbtNoDryRun
  include Sidekiq::Worker
  sidekiq_options qbridge_shadow: "dry_run"

  def perform; end
end
