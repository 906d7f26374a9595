# frozen_string_literal: true

# The qbridge-sidekiq gem's version (qbridge-sidekiq.gemspec, CHANGELOG.md).
module Qbridge
  SIDEKIQ_ADAPTER_VERSION = "0.2.0"
end
