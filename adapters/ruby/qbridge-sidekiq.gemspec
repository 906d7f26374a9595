# frozen_string_literal: true

require_relative "lib/qbridge/version"

Gem::Specification.new do |spec|
  spec.name = "qbridge-sidekiq"
  spec.version = Qbridge::SIDEKIQ_ADAPTER_VERSION
  spec.summary = "qbridge's Sidekiq adapter: the fleet's outcome reporter and the Postgres side's job runner"
  spec.description = <<~TEXT
    For a Sidekiq queue moving to qbridge's Postgres job queue: a server
    middleware that reports each job's outcome (ok, failed, dead) to qbridge,
    and qbridge-sidekiq-runner, qbridge's handler that runs the team's own
    Sidekiq job classes on the Postgres side (a dry run in shadow mode).
  TEXT
  spec.authors = ["qbridge contributors"]
  spec.license = "Apache-2.0"
  spec.required_ruby_version = ">= 2.7"
  spec.files = Dir["lib/**/*.rb", "bin/qbridge-sidekiq-runner", "README.md", "CHANGELOG.md"]
  spec.bindir = "bin"
  spec.executables = ["qbridge-sidekiq-runner"]
  spec.require_paths = ["lib"]
  spec.add_dependency "sidekiq", ">= 6", "< 9"
  # Outcomes over SQL (QBRIDGE_OUTCOMES=postgres://…) need the pg gem; over
  # HTTP nothing more. A gemspec cannot say "optional", so it is only named.
  spec.requirements << "the pg gem, only to report outcomes over SQL (QBRIDGE_OUTCOMES=postgres://...)"
  spec.metadata = { "rubygems_mfa_required" => "true" }
end
